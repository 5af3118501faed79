"""Llama 4's experts (issue 27): stacked weights without transformers' flags, the router's weight on
the expert's *input*, a shared expert the config does not name, and dense layers between expert
layers (Maverick's interleaving). Checked against plain transformers."""

from __future__ import annotations

import copy
import functools
import warnings

import pytest
import torch

import capinterp as ci
from capinterp.arch.tiny import tiny_hf

PROMPT = "The Eiffel Tower is in the city of"
TINY = dict(intermediate_size=48, num_local_experts=4, num_experts_per_tok=2, head_dim=8)


@functools.cache
def _pair(mixed: bool):
    extra = dict(moe_layers=[1], intermediate_size_mlp=40) if mixed else {}
    hf, tok = tiny_hf("llama4_text", **TINY, **extra)
    plain = copy.deepcopy(hf)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ci.load_model(hf, tokenizer=tok), plain, tok


@pytest.mark.parametrize("mixed", [False, True])
@torch.no_grad()
def test_logits_match_transformers(mixed):
    model, plain, tok = _pair(mixed)
    ids = tok(PROMPT, return_tensors="pt")["input_ids"]
    want = plain(ids).logits
    assert float((model(ids) - want).abs().max()) <= 1e-5 * float(want.abs().max())
    fam = ci.family_of(model)
    assert fam.moe.n_shared == 1 and fam.moe.d_shared == 48 and fam.d_mlp == 4 * 48 + 48 == model.cfg.d_mlp
    assert fam.layer_widths == ((40, fam.d_mlp) if mixed else ())


@torch.no_grad()
def test_neurons_are_the_expert_activations_of_the_router_weighted_input():
    """a[e, i] = act(gate_e(w_e x))[i] * up_e(w_e x)[i] on tokens routed to e, 0 elsewhere; the shared
    expert's neurons after them: computed by hand from the transformers modules."""
    model, plain, tok = _pair(False)
    ids = tok(PROMPT, return_tensors="pt")["input_ids"]
    layer = plain.model.layers[1]
    seen = {}
    layer.feed_forward.register_forward_pre_hook(lambda _m, a: seen.setdefault("x", a[0].reshape(-1, a[0].shape[-1])))
    plain(ids)
    x, moe = seen["x"], layer.feed_forward
    scores, _ = moe.router(x)  # [tokens, E], 0 where not routed
    gate_up = moe.experts.gate_up_proj  # [E, d_model, 2 d]
    want = []
    for e in range(4):
        h = (x * scores[:, e : e + 1]) @ gate_up[e]
        gate, up = h.chunk(2, dim=-1)
        a = torch.nn.functional.silu(gate) * up
        want.append(torch.where(scores[:, e : e + 1] != 0, a, torch.zeros_like(a)))
    sh = moe.shared_expert
    want.append(torch.nn.functional.silu(sh.gate_proj(x)) * sh.up_proj(x))
    _, cache = model.run_with_cache(ids, names_filter="blocks.1.mlp.hook_post")
    got = cache["blocks.1.mlp.hook_post"][0]
    assert torch.allclose(got, torch.cat(want, -1), atol=1e-6, rtol=1e-5)
    assert int((scores != 0).sum(-1).max()) == 2


@torch.no_grad()
def test_erasing_an_expert_zeroes_its_down_projection_in_transformers():
    model, plain, tok = _pair(False)
    ids = tok(PROMPT, return_tensors="pt")["input_ids"]
    hand = copy.deepcopy(plain)
    hand.model.layers[1].feed_forward.experts.down_proj[2].zero_()
    want = hand(ids).logits[0, -1]
    keys = ci.KeySet([(1, 2)], "expert", ("expert", 2, 4, True))
    with ci.erase(model, keys):
        got = model(ids)[0, -1]
    assert float((got - want).abs().max()) <= 1e-5 * float(want.abs().max())
