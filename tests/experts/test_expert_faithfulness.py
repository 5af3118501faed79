"""Experts as the units of ``ci.faithfulness`` on tiny MoE models, against plain transformers.

Zero ablation: the expert's stacked down projection zeroed in transformers (the shared expert's
``down_proj`` for ``"shared"``). Mean ablation: a forward hook on transformers' experts module
that replaces each ablated expert's routed output, computed by hand from its stacked weights and
the router's choice, by its mean over the tokens of the data (prompts and targets) routed to it
(first positions averaged apart from the later ones), on the tokens routed to it (the routing is kept).
"""

from __future__ import annotations

import copy

import pytest
import torch
from moe_tiny import load_tiny_moe, moe_block

import capinterp as ci
from capinterp.core.tokens import encode
from capinterp.data import Example
from capinterp.units.base import KeySet
from capinterp.units.experts import expert_keys

DATA = [
    Example("The Eiffel Tower is in the city of", " Paris"),
    Example("Rome is the capital of", " Italy"),
    Example("Berlin is the capital of", " Germany"),
]


def _load(family):
    model, plain, _, _ = load_tiny_moe(family)
    return model, plain


_block = moe_block


@torch.no_grad()
def _prob(model, plain, hooks=(), whole=False):
    """Mean p(target's first token) at the prompt's end on plain transformers, one example at a time
    (``whole``: the run reads prompt and target, as the mean's reference data)."""
    handles = [mod.register_forward_hook(fn) for mod, fn in hooks]
    try:
        ps = []
        for it in encode(model, DATA):
            logits = plain(torch.tensor([it.ids[: None if whole else it.last_prompt_pos + 1]])).logits[0, -1]
            ps.append(logits.double().softmax(-1)[it.target_ids[0]].item())
    finally:
        for h in handles:
            h.remove()
    return sum(ps) / len(ps)


@torch.no_grad()
def _zeroed(model, plain, experts):
    """p with the given (layer, expert) experts writing nothing: their down projections zeroed."""
    hf = copy.deepcopy(plain)
    for layer, e in experts:
        block = _block(hf, layer)
        if e == "shared":
            block.shared_expert.down_proj.weight.zero_()
        else:
            block.experts.down_proj[e] = 0.0
    return _prob(model, hf)


def _routed_output(experts, x, index, weights, e):
    """Mixtral expert ``e``'s output on every row of ``x``, times its router weight (0 where not routed)."""
    w = (weights * (index == e)).sum(-1, keepdim=True)
    return _output(experts, x, e) * w


def _output(experts, x, e):
    gate, up = torch.nn.functional.linear(x, experts.gate_up_proj[e]).chunk(2, dim=-1)
    return torch.nn.functional.linear(experts.act_fn(gate) * up, experts.down_proj[e])


def _mean_outputs(model, plain):
    """``{(layer, expert, first): mean routed output over the tokens of DATA (prompts and targets) that
    the router sent to the expert}`` (Mixtral), at first positions (``first=0``) and later ones (1),
    apart (one example per run: the experts' rows are the positions)."""
    sums: dict = {}
    count: dict = {}

    def rec(layer):
        def fn(mod, args, out):
            x, index, weights = args
            for e in range(mod.num_experts):
                y = _routed_output(mod, x, index, weights, e).double()
                on = (index == e).any(-1)
                for kind, rows in ((0, slice(0, 1)), (1, slice(1, None))):
                    sums[layer, e, kind] = sums.get((layer, e, kind), 0) + y[rows].sum(0)
                    count[layer, e, kind] = count.get((layer, e, kind), 0) + int(on[rows].sum())

        return fn

    n_layers = len(plain.model.layers)
    _prob(model, plain, [(_block(plain, l).experts, rec(l)) for l in range(n_layers)], whole=True)
    means = {k: (v / max(count[k], 1)).float() for k, v in sums.items()}
    for layer, e, kind in list(means):
        if kind == 1 and not count[layer, e, 1]:  # never routed after the first position: the first's mean
            means[layer, e, 1] = means[layer, e, 0]
    assert any(count.values()), count
    return means


def _mean_ablated(model, plain, means, experts):
    def swap(layer):
        def fn(mod, args, out):
            x, index, weights = args
            for lay, e in experts:
                if lay == layer:  # where the router sent the token: the mean instead of its output
                    routed = (index == e).any(-1, keepdim=True)
                    mean = torch.stack([means[lay, e, 0]] + [means[lay, e, 1]] * (x.shape[0] - 1))
                    out = out - _routed_output(mod, x, index, weights, e) + mean * routed
            return out

        return fn

    n_layers = len(plain.model.layers)
    return _prob(model, plain, [(_block(plain, l).experts, swap(l)) for l in range(n_layers)])


def _all(model):
    moe = model.capinterp_family.moe
    return [(l, e) for l in range(model.cfg.n_layers) for e in expert_keys(moe)]


def _random_sets(n_units, sizes, draws, seed):
    """The random unit draws of ci.faithfulness (seeded randperm per size, in order)."""
    gen = torch.Generator().manual_seed(seed)
    return {k: [torch.randperm(n_units, generator=gen)[:k].tolist() for _ in range(draws)] for k in sizes}


def test_zero_ablating_an_expert_set_is_zeroing_their_down_projections():
    model, plain = _load("mixtral")
    units = KeySet([(0, 1), (1, 2), (1, 3)], "expert")
    res = ci.faithfulness(model, units, DATA, ablation="zero", random_sets=2, seed=3)
    everything = _all(model)
    assert res.meta["unit"] == "expert" and res.meta["n_units"] == len(everything) == 8
    assert res.full == pytest.approx(_prob(model, plain), rel=1e-5)
    assert res.empty == pytest.approx(_zeroed(model, plain, everything), rel=1e-5)
    row = res.table.iloc[0]
    assert row["k"] == 3
    assert row["kept"] == pytest.approx(_zeroed(model, plain, [u for u in everything if u not in units]), rel=1e-5)
    assert row["ablated"] == pytest.approx(_zeroed(model, plain, list(units)), rel=1e-5)
    # random sets: random experts, as many as the set has
    kept = [
        _zeroed(model, plain, [u for i, u in enumerate(everything) if i not in draw])
        for draw in _random_sets(8, [3], 2, 3)[3]
    ]
    assert row["random_kept_mean"] == pytest.approx(sum(kept) / 2, rel=1e-5)
    assert res.full != pytest.approx(row["ablated"], rel=1e-3), "ablating three experts changed nothing"


def test_mean_ablation_gives_experts_their_mean_output_ranked_by_expert_scores():
    model, plain = _load("mixtral")
    scores = torch.tensor([[0.1, 0.9, -0.2, 0.3], [0.5, -1.0, 0.8, 0.0]])  # [layers, experts]
    res = ci.faithfulness(model, scores, DATA, ks=[1, 3], ablation="mean", random_sets=0)
    means = _mean_outputs(model, plain)
    everything = _all(model)
    order = [(0, 1), (1, 2), (1, 0)]  # best first
    assert res.empty == pytest.approx(_mean_ablated(model, plain, means, everything), rel=1e-4)
    for (_, row), k in zip(res.table.iterrows(), [1, 3]):
        top = order[:k]
        want_kept = _mean_ablated(model, plain, means, [u for u in everything if u not in top])
        assert row["kept"] == pytest.approx(want_kept, rel=1e-4)
        assert row["ablated"] == pytest.approx(_mean_ablated(model, plain, means, top), rel=1e-4)
        assert abs(row["ablated"] - res.full) > 1e-3 * res.full, "mean-ablating the top experts changed nothing"


def test_shared_expert_is_a_faithfulness_unit():
    model, plain = _load("qwen2_moe")
    units = KeySet([(1, "shared"), (0, 2)], "expert")
    res = ci.faithfulness(model, units, DATA, ablation="zero", random_sets=0)
    assert res.meta["n_units"] == 2 * 5
    row = res.table.iloc[0]
    assert row["ablated"] == pytest.approx(_zeroed(model, plain, list(units)), rel=1e-5)
    everything = _all(model)
    assert row["kept"] == pytest.approx(_zeroed(model, plain, [u for u in everything if u not in units]), rel=1e-5)


def test_bad_expert_units_refused_before_any_run():
    model, _ = _load("mixtral")
    with pytest.raises(ValueError, match="not one of"):
        ci.faithfulness(model, KeySet([(0, 7)], "expert"), DATA)
    with pytest.raises(ValueError, match="no shared expert"):
        ci.faithfulness(model, KeySet([(0, "shared")], "expert"), DATA)
    with pytest.raises(ValueError, match="dense FFNs"):
        ci.faithfulness(ci.load_model("tiny"), KeySet([(0, 1)], "expert"), DATA)
