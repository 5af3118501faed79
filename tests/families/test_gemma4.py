"""Gemma 4's text model (row gemma4_text of the family matrix, which checks every method against plain
transformers): what that row does not show on its own. Its last layer reuses layer 1's keys and values
from the same forward (KV sharing), so IG's staircase must hand it the keys of the rows it runs; its
KV-sharing layer's MLP is twice as wide, padded onto one neuron axis; its per-layer embeddings and
layer scales refuse the circuit graph; its MoE layers (experts beside the MLP) are refused at load."""

from __future__ import annotations

import functools
import warnings

import pytest
import torch

import capinterp as ci
from capinterp.circuits.head_patching import head_effects
from capinterp.core.example import Example
from capinterp.core.family import UnsupportedFamily, family_of
from capinterp.core.layer_extras import layer_extras
from capinterp.core.tiny import tiny_hf
from capinterp.core.tokens import encode
from capinterp.kernels import prefix as _prefix
from capinterp.kernels.ig import site


@functools.cache
def _model(family: str = "gemma4_text"):
    hf, tok = tiny_hf(family)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ci.load_model(hf, tokenizer=tok)


@pytest.mark.parametrize("batch", [False, True])
def test_staircase_rows_read_the_keys_their_own_forward_shares(batch, monkeypatch):
    """Rows entering at every layer, the KV-sharing last one included, give the logits of transformers'
    own forward with the same neurons (the prefix route: whole forwards over the cached prefix), with
    the rows folded into one sequence and in the batch dimension (GPT-Neo's layout)."""
    model = _model()
    monkeypatch.setattr(_prefix, "_batch_layout", lambda m: batch)
    assert model.original_model.model.layers[2].self_attn.is_kv_shared_layer
    s = site(encode(model, [Example("The Eiffel Tower is in the city of", " Paris")])[0], "answer")
    run = _prefix.clean_suffix(model, s.seq, s.p0, keep_cache=True)
    assert run.cache is not None and s.p0 > 0
    gen = torch.Generator().manual_seed(0)
    groups = [(l, run.acts[l][None] + torch.randn(2, *run.acts[l].shape, generator=gen)) for l in range(3)]
    with torch.no_grad():
        got, want = _prefix.stair_logits(model, run, groups), _prefix.bridge_logits(model, run, groups)
    assert got.shape == want.shape
    assert (got - want).abs().max() <= 1e-4 * want.abs().max()
    clean_last = [(2, run.acts[2][None])]  # a row entering at the last layer is the clean run
    with torch.no_grad():
        assert torch.allclose(_prefix.stair_logits(model, run, clean_last)[0], run.logits, atol=1e-4)
    assert _prefix.stair_supported(model, run)


def test_double_wide_mlp_is_the_axis_and_padding_is_no_neuron():
    model = _model()
    fam = family_of(model)
    assert (fam.d_mlp, fam.layer_widths) == (192, (96, 96, 192))
    acts = {}
    tokens = model.to_tokens("Rome is the capital of")
    model.run_with_hooks(
        tokens,
        fwd_hooks=[(f"blocks.{l}.mlp.hook_post", lambda a, hook, l=l: acts.__setitem__(l, a)) for l in range(3)],
    )
    assert all(a.shape[-1] == 192 for a in acts.values())
    assert acts[0][..., 96:].abs().max() == 0  # padding: always 0
    assert acts[2][..., 96:].abs().max() > 0  # the wide layer's own neurons


def test_circuit_graph_refused_naming_the_per_layer_steps():
    model = _model()
    assert len(layer_extras(model)) == 2
    kc = ci.KnowledgeCircuit(model, algorithm="eap", top_n=5, progress=False)
    with pytest.raises(UnsupportedFamily, match=r"^gemma4_text .*per-layer embeddings.*layer_scalar != 1"):
        kc.fit([Example("Rome is the capital of", " Italy")])
    with pytest.raises(UnsupportedFamily, match="layer_scalar"):
        head_effects(model, [Example("Rome is the capital of", " Italy")])


def test_layer_scalars_of_one_and_no_per_layer_embeddings_are_no_extras():
    """A layer scale of exactly 1 changes nothing; Gemma 3 has no such steps."""
    model = _model("gemma3_text")
    assert layer_extras(model) == []


def test_moe_layers_refused_at_load_naming_the_normalized_experts():
    hf, tok = tiny_hf("gemma4_text", enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=24)
    with pytest.raises(UnsupportedFamily, match=r"^gemma4_text .*experts beside its dense MLP.*not a sum over neurons"):
        ci.load_model(hf, tokenizer=tok)
