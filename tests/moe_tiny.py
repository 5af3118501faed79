"""Tiny MoE models for the expert tests: the families served, loading beside an untouched copy, and
the transformers MoE block of a layer (read on the plain model, never through capinterp)."""

from __future__ import annotations

import copy
import warnings

import torch

import capinterp as ci
from capinterp.arch.tiny import tiny_hf
from capinterp.testing.family_checks._moe_ref import flag_jetmoe

#: every MoE family of the matrix whose experts are stacked 3-D weights (all of them today)
MOE_FAMILIES = (
    "mixtral",
    "qwen2_moe",
    "qwen3_moe",
    "olmoe",
    "gpt_oss",
    "granitemoe",
    "flex_olmo",
    "minimax_m2",
    "ernie4_5_moe",
    "glm4_moe",
    "glm4_moe_lite",
    "afmoe",
    "laguna",
    "llama4_text",
    "jetmoe",
    "phimoe",
    "hunyuan_v1_moe",
    "dots1",
    "lfm2_moe",
    "jamba",
    "granitemoehybrid",
    "nemotron_h",
    "deepseek_v4",
)


#: the families whose tiny model (the released layout) has a dense layer 0: here every layer is an
#: expert layer, so these tests see experts in each layer (mixed layouts: tests/experts/test_mixed_layers.py
#: and the family matrix)
ALL_EXPERT_LAYERS = {
    "ernie4_5_moe": dict(moe_layer_start_index=0),
    "glm4_moe": dict(first_k_dense_replace=0),
    "glm4_moe_lite": dict(mlp_layer_types=["sparse", "sparse"]),
    "afmoe": dict(num_dense_layers=0),
    "laguna": dict(mlp_layer_types=["sparse", "sparse"]),
    "dots1": dict(first_k_dense_replace=0),
    "lfm2_moe": dict(num_dense_layers=0),
    "jamba": dict(expert_layer_period=1, expert_layer_offset=0),
    # one sublayer per layer: two expert layers, then attention (transformers' cache needs one to tell its length)
    "nemotron_h": dict(layers_block_type=["moe", "moe", "full_attention"], num_hidden_layers=3),
}


def load_tiny_moe(family: str, **overrides):
    """``(capinterp model, plain transformers copy made before loading, tokenizer, the hf model capinterp wraps)``;
    ``overrides`` set further config fields."""
    hf, tok = tiny_hf(family, **{**ALL_EXPERT_LAYERS.get(family, {}), **overrides})
    plain = copy.deepcopy(hf)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = ci.load_model(hf, tokenizer=tok)
    return model, plain, tok, hf


def moe_block(hf, layer: int) -> torch.nn.Module:
    """The layer's MoE FFN block: its child with a stacked ``experts`` module (``mlp``; GraniteMoE's
    ``block_sparse_moe``), or JetMoE's, given an ``experts`` view of its parallel experts with
    transformers' flags (the reference's :func:`flag_jetmoe`)."""
    for name, m in hf.model.layers[layer].named_children():
        inner = getattr(m, "original_component", m)  # behind the bridge's wrapper
        if flag_jetmoe(inner):
            return inner
        if "att" not in name and isinstance(getattr(m, "experts", None), torch.nn.Module):  # not JetMoE's attention
            return m
    raise LookupError(f"no MoE block in layer {layer}")


#: the dense layer 0's neurons of :func:`load_tiny_mixed`'s model
MIXED_DENSE = 64


def load_tiny_mixed():
    """``(capinterp model, plain transformers copy made before loading, tokenizer)`` of a tiny DeepSeek-V2
    mixing a dense layer 0 (``MIXED_DENSE`` neurons) with an MoE layer 1 (a 240-neuron axis: 4 experts
    of 48 + a shared 48), the released layout (``first_k_dense_replace``)."""
    hf, tok = tiny_hf("deepseek_v2", first_k_dense_replace=1, intermediate_size=MIXED_DENSE)
    plain = copy.deepcopy(hf).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ci.load_model(hf, tokenizer=tok), plain, tok
