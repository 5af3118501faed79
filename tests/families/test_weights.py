"""capinterp.arch.weights: the down projection read as [d_mlp, d_model] and written back, on every storage layout."""

from __future__ import annotations

import pytest
import torch

import capinterp as ci
from capinterp.arch.family import UnsupportedFamily
from capinterp.arch.tiny import tiny_hf
from capinterp.arch.weights import down_projection
from capinterp.testing.family_checks._hf import mlp_down

# Conv1D [in, out] (GPT-2), nn.Linear [out, in] (Llama, GPT-J's fc_out), FalconLinear (a Linear subclass),
# BLOOM's dense_4h_to_h, OPT's fc2 (no MLP container), a parallel block (GPT-NeoX)
FAMILIES = ("gpt2", "llama", "gptj", "falcon", "bloom", "opt", "gpt_neox")


@pytest.mark.parametrize("family", FAMILIES)
def test_values_are_the_hf_projection(family):
    """keys @ values() + bias equals the HF down-projection module applied to the same keys (plain torch)."""
    hf, tok = tiny_hf(family)
    model = ci.load_model(hf, tokenizer=tok)
    ref, _ = tiny_hf(family)  # untouched copy with the same weights
    down = mlp_down(ref, 1)  # found by transformers' module names, not through capinterp
    proj = down_projection(model, 1)
    d_mlp, d_model = int(model.cfg.d_mlp), int(model.cfg.d_model)
    assert tuple(proj.values().shape) == (d_mlp, d_model)
    keys = torch.randn(5, d_mlp, generator=torch.Generator().manual_seed(0))
    bias = down.bias if getattr(down, "bias", None) is not None else torch.zeros(d_model)
    with torch.no_grad():
        torch.testing.assert_close(proj.apply(keys) + bias, down(keys), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("family", ("gpt2", "llama"))
def test_write_and_add_round_trip(family):
    """write() then add() change exactly the stored weight, row i of values() being neuron i."""
    hf, tok = tiny_hf(family)
    model = ci.load_model(hf, tokenizer=tok)
    proj = down_projection(model, 0)
    old = proj.values().detach().clone()
    new = torch.arange(old.numel(), dtype=torch.float32).reshape(old.shape) / old.numel()
    proj.write(new)
    torch.testing.assert_close(proj.values(), new)
    delta = torch.zeros_like(new)
    delta[3] = 1.0  # neuron 3's value vector
    proj.add(delta)
    stored = proj.weight.detach()
    neuron3 = stored[3] if proj.neuron_dim == 0 else stored[:, 3]
    torch.testing.assert_close(neuron3, new[3] + 1.0)
    proj.write(old)
    torch.testing.assert_close(proj.values(), old)


def test_unreadable_projection_is_refused():
    """A down projection that is not [d_mlp, d_model] is an UnsupportedFamily naming the family."""
    hf, tok = tiny_hf("llama")
    model = ci.load_model(hf, tokenizer=tok)
    out = model.blocks[0].mlp.out.original_component
    out.weight = torch.nn.Parameter(torch.zeros(7, 7))
    with pytest.raises(UnsupportedFamily, match="llama.*down projection of layer 0"):
        down_projection(model, 0)
    with pytest.raises(ValueError, match="layer must be"):
        down_projection(model, 5)
