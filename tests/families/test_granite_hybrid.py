"""Granite 4.0 (transformers' GraniteMoeHybrid): one FFN per layer, the shared MLP beside the experts included.

Its decoder layer adds two modules, the sparse experts and a shared MLP, and the bridge maps them as two
(``moe``, ``shared_mlp``), so no ``mlp`` and no ``hook_mlp_out``. capinterp loads it with its own adapter
(the bridge's, the FFN as one ``mlp``) and serves the shared MLP's neurons on the experts' axis. Checked
here against the plain transformers model, written by hand; the family matrix checks every method.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

import capinterp as ci
from capinterp.arch.family import UnsupportedFamily, family_of
from capinterp.arch.tiny import TINY_FAMILIES, tiny_hf

IDS = torch.tensor([[1, 5, 9, 30, 7, 2, 11]])
KW = TINY_FAMILIES["granitemoehybrid"]
ROUTED = KW["num_local_experts"] * KW["intermediate_size"]  # 4 experts x 48 neurons, then the shared MLP's 64


# Granite 4.0 H-Micro's layout: Mamba-2 and attention layers, no experts (the matrix's dense row has attention only)
H_DENSE = {k: KW[k] for k in ("layer_types", "mamba_n_heads", "mamba_d_head", "mamba_d_state")}  # the MoE row's layers


def _load(family: str = "granitemoehybrid", **overrides):
    hf, tok = tiny_hf(family, **overrides)
    plain = copy.deepcopy(hf)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ci.load_model(hf, tokenizer=tok), plain, hf


def test_bridge_keeps_its_own_adapter_for_everyone_else():
    """capinterp's adapter is used while capinterp loads the model, and only then."""
    from transformer_lens.factories.architecture_adapter_factory import ArchitectureAdapterFactory
    from transformer_lens.model_bridge.supported_architectures.granite_moe_hybrid import (
        GraniteMoeHybridArchitectureAdapter,
    )

    model, _, _ = _load()
    assert type(model.adapter).__name__ == "GraniteHybridOneFFN"
    assert ArchitectureAdapterFactory._adapters["GraniteMoeHybridForCausalLM"] is GraniteMoeHybridArchitectureAdapter


@pytest.mark.parametrize(
    ("family", "overrides"),
    [("granitemoehybrid", {}), ("granitemoehybrid_dense", {}), ("granitemoehybrid_dense", H_DENSE)],
)
def test_one_ffn_per_layer_its_contribution_at_hook_mlp_out(family, overrides):
    """Every layer has one neuron axis (experts then shared MLP; the shared MLP alone without experts), and
    hook_mlp_out is the whole FFN's contribution: what the layer adds after its mixer (Granite scales it by
    residual_multiplier)."""
    model, plain, _ = _load(family, **overrides)
    mamba = family == "granitemoehybrid" or bool(overrides)
    assert family_of(model).hybrid_layers == (("linear_attention",) if mamba else ())
    kw = TINY_FAMILIES[family]
    want = kw["shared_intermediate_size"] + kw.get("num_local_experts", 0) * kw.get("intermediate_size", 0)
    assert family_of(model).d_mlp == want
    _, cache = model.run_with_cache(IDS)
    for layer in range(2):
        assert cache[f"blocks.{layer}.mlp.hook_post"].shape[-1] == want
        added = cache[f"blocks.{layer}.hook_resid_post"] - cache[f"blocks.{layer}.hook_resid_mid"]
        torch.testing.assert_close(cache[f"blocks.{layer}.hook_mlp_out"], added, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(model(IDS), plain(IDS).logits, atol=1e-5, rtol=1e-5)


def test_shared_mlp_neurons_are_its_own():
    """Zeroing the axis past the routed experts' neurons is the plain model with its shared MLP switched
    off (by hand: its forward returns 0), and nothing else; the wrapped model's shared MLP module returns 0
    (the block computes it)."""
    model, plain, hf = _load()

    def off(x, hook):
        x = x.clone()
        x[..., ROUTED:] = 0
        return x

    got = model.run_with_hooks(IDS, fwd_hooks=[(f"blocks.{l}.mlp.hook_post", off) for l in range(2)])
    for layer in plain.model.layers:
        layer.shared_mlp.forward = lambda x: torch.zeros_like(x)
    torch.testing.assert_close(got, plain(IDS).logits, atol=1e-5, rtol=1e-5)
    x = torch.randn(3, 32)
    assert torch.equal(hf.model.layers[0].shared_mlp(x), torch.zeros_like(x))


def test_shared_mlp_computing_something_else_refused_at_load(monkeypatch):
    """A shared MLP whose forward is not activation(gate) * up of its fused weights (here doubled) is
    refused at load, naming the layer, never served with wrong numbers."""
    from transformers.models.granitemoehybrid.modeling_granitemoehybrid import GraniteMoeHybridMLP

    real = GraniteMoeHybridMLP.forward
    monkeypatch.setattr(GraniteMoeHybridMLP, "forward", lambda self, h: 2.0 * real(self, h))
    hf, tok = tiny_hf("granitemoehybrid")
    with pytest.raises(UnsupportedFamily, match="^granitemoehybrid .*layer 0.*not the router-weighted sum.*differs by"):
        ci.load_model(hf, tokenizer=tok)
