"""Head patching and AtP on hybrid models: the heads of the attention layers, NaN rows for the layers
without attention, against zero-ablation and gradients written by hand on plain transformers (the
output projection's input of head h zeroed; ``z_h . dp/dz_h``)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import capinterp as ci
from capinterp.arch.family import UnsupportedFamily
from capinterp.arch.model import attention_layers
from capinterp.arch.tiny import tiny_hf
from capinterp.circuits.head_patching import head_atp, head_atp_graddrop, head_effects
from capinterp.core.tokens import encode
from capinterp.testing.family_checks._models import load_pair
from capinterp.testing.family_checks.circuits import _layers, _out_proj

FACT = ci.Example("Rome is the capital of", " Italy", meta={"subject": "Rome"})
# not OLMo-Hybrid: a post-norm attention layer's head output is its share of the normalized output at the
# clean run's norm scale (capinterp.circuits.forward), as on Gemma 2/3 and OLMo 2, not a zeroed z_h
FAMILIES = ["bamba", "falcon_h1", "nemotron_h", "lfm2", "jamba"]


def _reference(family: str, ids: list[int], last: int, target: int) -> tuple[np.ndarray, np.ndarray]:
    """``(exact, atp)`` ``[n_layers, n_heads]`` on plain transformers, NaN where a layer has no attention."""
    hf = tiny_hf(family)[0]
    cfg = hf.config.get_text_config()
    H = cfg.num_attention_heads
    layers = _layers(hf)
    x = torch.tensor([ids])

    def prob() -> torch.Tensor:
        return hf(x).logits[0, last].double().softmax(-1)[target]

    exact = np.full((len(layers), H), np.nan)
    atp = np.full((len(layers), H), np.nan)
    with torch.no_grad():
        clean = float(prob())
    for l, layer in enumerate(layers):
        o = _out_proj(layer)
        if o is None:
            continue
        for h in range(H):

            def zero(m, a, h=h):
                z = a[0].clone()
                d = z.shape[-1] // H
                z[..., h * d : (h + 1) * d] = 0
                return (z,) + a[1:]

            handle = o.register_forward_pre_hook(zero)
            try:
                with torch.no_grad():
                    exact[l, h] = clean - float(prob())
            finally:
                handle.remove()
        got: list[torch.Tensor] = []

        def leaf(m, a):
            got.append(a[0].detach().requires_grad_(True))
            return (got[-1],) + a[1:]

        handle = o.register_forward_pre_hook(leaf)
        try:
            with torch.enable_grad():
                (g,) = torch.autograd.grad(prob(), got)
        finally:
            handle.remove()
        z = got[0]
        atp[l] = (g * z).detach().double().unflatten(-1, (H, -1)).sum((0, 1, 3)).numpy()
    return exact, atp


@pytest.mark.parametrize("family", FAMILIES)
def test_head_patching_on_a_hybrid_model_matches_transformers(family):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = load_pair(family)[2]
        enc = encode(model, [FACT])[0]
        exact = head_effects(model, [FACT])
        atp = head_atp(model, [FACT])
        gd = head_atp_graddrop(model, [FACT])
    want_exact, want_atp = _reference(family, enc.ids, enc.last_prompt_pos, enc.target_ids[0])
    att = attention_layers(model)
    assert att  # Falcon-H1: attention beside Mamba in every layer
    no_heads = [l for l in range(model.cfg.n_layers) if l not in att]
    for got in (exact, atp, gd):
        assert np.isnan(got[no_heads]).all() and not np.isnan(got[att]).any()
    scale = np.nanmax(np.abs(want_exact))
    assert scale > 0
    assert np.nanmax(np.abs(exact - want_exact)) <= 1e-5 * scale + 1e-9
    assert np.nanmax(np.abs(atp - want_atp)) <= 1e-5 * np.nanmax(np.abs(want_atp)) + 1e-9


def test_relp_refuses_hybrid_models_naming_the_mixers():
    from capinterp.circuits.relp import head_relp

    model = load_pair("bamba")[2]
    with pytest.raises(UnsupportedFamily, match=r"bamba.*RelP.*linear_attention.*head_atp"):
        head_relp(model, [FACT])
