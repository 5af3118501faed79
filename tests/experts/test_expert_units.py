"""Experts as units on tiny MoE models, against plain transformers: erasing an expert, routed-only
attribution, weights and owned entries of expert neurons, refusals."""

from __future__ import annotations

import pytest
import torch
from moe_tiny import MOE_FAMILIES, load_tiny_moe, moe_block

import capinterp as ci
from capinterp.arch.weights import down_projection
from capinterp.data import Example
from capinterp.interventions.neuron_params import neuron_masks, zero_neurons
from capinterp.units.base import KeySet
from capinterp.units.experts import expert_keys, expert_neurons, expert_scores, top_experts

FAMILIES = MOE_FAMILIES
TEXT = "The Eiffel Tower is in the city of"


def _load(family):
    model, plain, tok, _ = load_tiny_moe(family)
    return model, plain, tok


_moe = moe_block


def _experts(hf, layer):
    return _moe(hf, layer).experts


@pytest.mark.parametrize("family", FAMILIES)
def test_erasing_an_expert_is_zeroing_its_down_projection_in_transformers(family):
    model, plain, tok = _load(family)
    ids = tok(TEXT, return_tensors="pt")["input_ids"]
    keys = KeySet([(1, 2), (1, 3), (0, 0), (0, 1)], "expert")
    with torch.no_grad():
        before = model(ids)[0, -1]
        with ci.erase(model, keys):
            got = model(ids)[0, -1]
        for layer, e in keys:
            _experts(plain, layer).down_proj[e] = 0.0  # the expert writes nothing (gpt-oss: its bias stays)
        want = plain(ids).logits[0, -1]
    assert (got - want).abs().max() < 1e-5 * want.abs().max()
    assert (got - before).abs().max() > 1e-3, "erasing four experts changed nothing"


@pytest.mark.parametrize("family", ["mixtral", "qwen2_moe", "glm4_moe", "laguna", "hunyuan_v1_moe"])
def test_shared_expert_is_a_unit(family):
    model, plain, tok = _load(family)
    moe = model.capinterp_family.moe
    assert expert_keys(moe)[-1] == ("shared" if moe.d_shared else moe.n_experts - 1)
    if not moe.d_shared:
        with pytest.raises(ValueError, match="no shared expert"):
            expert_neurons(model, [(0, "shared")])
        return
    ids = tok(TEXT, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        with ci.erase(model, expert_neurons(model, [(1, "shared")])):
            got = model(ids)[0, -1]
        block = _moe(plain, 1)
        shared = next(  # Qwen2-MoE's, with its gate; HunYuan-MoE's shared_mlp
            getattr(block, k) for k in ("shared_expert", "shared_experts", "shared_mlp") if hasattr(block, k)
        )
        shared.down_proj.weight.zero_()
        want = plain(ids).logits[0, -1]
    assert (got - want).abs().max() < 1e-5 * want.abs().max()


@pytest.mark.parametrize("family", FAMILIES)
def test_attribution_only_on_routed_experts(family):
    """KN's IG at the last token: experts the router did not choose there score exactly 0."""
    model, plain, tok = _load(family)
    moe = model.capinterp_family.moe
    scores = ci.localizers.get("kn")(model, progress=False).fit([Example(TEXT, " Paris")]).scores_.scores
    ids = tok(TEXT, return_tensors="pt")["input_ids"]
    for layer, width in enumerate(ci.family_of(model).layer_widths or [moe.width] * len(plain.model.layers)):
        if width == 0:  # a layer without an FFN (NemotronH's attention layer): no neuron scores at all
            assert not scores[layer].any()
            continue
        block = _moe(plain, layer)
        router = getattr(block, "router", None) or block.gate
        out = {}  # the experts transformers' router chose, as the block ran it
        h = router.register_forward_hook(lambda m, i, o: out.__setitem__("out", o))
        with torch.no_grad():
            plain(ids)
        h.remove()
        if len(out["out"]) == 2:  # Llama 4's router: (scores over all experts, 0 where not chosen; logits)
            chosen = set(out["out"][0].reshape(ids.shape[1], -1)[-1].nonzero().flatten().tolist())
        elif len(out["out"]) == 5:  # JetMoE's: choices grouped by expert, logits last: the top-k of those
            chosen = set(out["out"][4][-1].topk(moe.top_k).indices.tolist())
        else:  # (logits, top-k weights, top-k indices)
            chosen = set(out["out"][2].reshape(ids.shape[1], -1)[-1].tolist())
        per = scores[layer, : moe.n_experts * moe.d_expert].reshape(moe.n_experts, moe.d_expert)
        for e in range(moe.n_experts):
            assert (per[e] != 0).any() == (e in chosen), f"{family} layer {layer} expert {e}: chosen {chosen}"


@pytest.mark.parametrize("family", ["mixtral", "gpt_oss", "qwen2_moe", "minimax_m2"])
def test_value_vectors_and_owned_entries(family):
    model, plain, tok = _load(family)
    moe = model.capinterp_family.moe
    ex = _experts(plain, 1)
    values = down_projection(model, 1).values()
    e, j = 3, 5
    want = ex.down_proj[e, j] if ex.is_transposed else ex.down_proj[e, :, j]
    assert torch.equal(values[e * moe.d_expert + j], want)
    ns = expert_neurons(model, [(1, 3)])
    masks = neuron_masks(model, ns)
    owned = sum(int(m.sum()) for m in masks.values())
    per_neuron = 3 * model.cfg.d_model + (2 if ex.has_bias else 0)  # gate row, up row, value (+ 2 biases)
    assert owned == moe.d_expert * per_neuron
    ids = tok(TEXT, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        with ci.erase(model, ns):
            erased = model(ids)[0, -1]
        assert zero_neurons(model, ns) == owned
        zeroed = model(ids)[0, -1]
    assert (erased - zeroed).abs().max() < 1e-6


def test_expert_rankings_and_bad_input():
    model, _, _ = _load("qwen2_moe")
    moe = model.capinterp_family.moe
    scores = torch.zeros(model.cfg.n_layers, moe.width)
    scores[1, 2 * moe.d_expert : 3 * moe.d_expert] = 1.0
    scores[0, -1] = 0.5
    per = expert_scores(model, scores)
    assert per.shape == (2, moe.n_experts + 1) and per[1, 2] == moe.d_expert and per[0, -1] == 0.5
    assert top_experts(model, scores, 2).keys() == {(1, 2), (0, "shared")}
    with pytest.raises(ValueError, match="scores must be"):
        expert_scores(model, scores[:, :-1])
    with pytest.raises(ValueError, match="not one of"):
        expert_neurons(model, [(0, 9)])
    dense = ci.load_model("tiny")
    with pytest.raises(ValueError, match="dense FFNs"):
        expert_scores(dense, torch.zeros(dense.cfg.n_layers, dense.cfg.d_mlp))


@pytest.mark.parametrize(("expert", "match"), [(4, "expert"), (-1, "expert"), (1.5, "expert")])
def test_rome_expert_out_of_range_refused_before_any_work(expert, match, monkeypatch):
    """An expert index the layer does not have is refused before any forward pass (per-expert ROME)."""
    from capinterp.interventions import rome

    model, _, _ = _load("olmoe")
    monkeypatch.setattr(rome, "_optimise", lambda *a, **k: pytest.fail("work started"))
    fact = Example("The Eiffel Tower is in", " Paris")
    with pytest.raises((ValueError, TypeError), match=match):
        ci.rome_edit(model, fact, subject="Eiffel Tower", new_target=" Rome", layer=0, expert=expert)


def test_router_weights_stay_in_the_gradient_path():
    """d p(target) / d a for layer-0 expert neurons equals the finite difference of the model's own
    output (routing unchanged for a small step), and detaching the later router's weights changes
    it: the router weights are in the gradient path, as the attribution methods need."""
    model, _, tok = _load("mixtral")
    ids = tok(TEXT, return_tensors="pt")["input_ids"]
    target = tok(" Paris")["input_ids"][0]
    name = "blocks.0.mlp.hook_post"
    _, cache = model.run_with_cache(ids, names_filter=lambda n: n == name)
    clean = cache[name].detach()
    neurons = clean[0, -1].nonzero().flatten()[:4].tolist()  # routed neurons at the last token

    def p_of(act: torch.Tensor) -> torch.Tensor:
        logits = model.run_with_hooks(ids, fwd_hooks=[(name, lambda a, hook: act)])
        return logits[0, -1].softmax(-1)[target]

    def grad(detach_router: bool) -> torch.Tensor:
        handles = []
        if detach_router:
            router = model.capinterp_experts[1].router
            handles.append(router.register_forward_hook(lambda m, i, o: tuple(t.detach() for t in o)))
        act = clean.clone().requires_grad_(True)
        try:
            (g,) = torch.autograd.grad(p_of(act), act)
        finally:
            for h in handles:
                h.remove()
        return g[0, -1, neurons]

    eps = 1e-2
    fd = []
    with torch.no_grad():
        for i in neurons:
            up, down = clean.clone(), clean.clone()
            up[0, -1, i] += eps
            down[0, -1, i] -= eps
            fd.append(float(p_of(up) - p_of(down)) / (2 * eps))
    fd_t = torch.tensor(fd)
    full, detached = grad(False), grad(True)
    assert torch.allclose(full, fd_t, rtol=2e-2, atol=1e-6), (full, fd_t)
    assert (detached - full).abs().max() > 1e-3 * full.abs().max(), "the later router's weights carry no gradient"


def test_docs_example_runs():
    """The usage example of docs/models.md (mixture of experts), on a tiny OLMoE."""
    model, _, _ = _load("olmoe")
    kn = ci.KN(model, progress=False).fit([ci.Example("The Eiffel Tower is in the city of", " Paris")])
    layer, flat = divmod(int(kn.scores_.scores.argmax()), model.cfg.d_mlp)
    expert, neuron = model.capinterp_family.moe.locate(flat)
    assert flat == expert * model.capinterp_family.moe.d_expert + neuron
    top = top_experts(model, kn.scores_, k=3)
    assert len(top) == 3 and all(0 <= l < model.cfg.n_layers for l, _ in top)
    with ci.erase(model, top):
        pass
