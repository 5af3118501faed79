"""ci.certify: the bounds are exact test inversions (checked against brute force), they cover the
truth in at least 1 - delta of 200 seeded trials on the planted tiny model's exhaustively computed
effects and on a synthetic population where the count bound is tight (where the plug-in estimate,
no bound, fails the same check), the patches are the hand-written single-neuron ablation, and bad
input is refused before any forward pass."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from moe_tiny import load_tiny_moe
from planting import PLANTED, plant

import capinterp as ci
from capinterp.arch.model import neuron_hook
from capinterp.core.tokens import encode
from capinterp.data import Example
from capinterp.interventions.certify import certify
from capinterp.interventions.certify_bounds import bounds, hypergeom_cdf, hypergeom_upper, plan
from capinterp.interventions.certify_coverage import coverage, min_coverage, synthetic_population
from capinterp.units.experts import expert_keys, expert_units, moe_of

EXAMPLES = [Example(f"{a}+{b}=", "7") for a, b in [(3, 4), (5, 2), (1, 6), (2, 5), (6, 1), (4, 3)]]
TRIALS, DELTA = 200, 0.05


@pytest.fixture(scope="module")
def planted():
    m = ci.load_model("tiny")
    plant(m, EXAMPLES)
    s = torch.rand(*m.W_in.shape[::2], generator=torch.Generator().manual_seed(0)) * 0.1
    for l, i in PLANTED:
        s[l, i] = 10.0
    return m, ci.NeuronScores(s)


@pytest.fixture(scope="module")
def exhaustive(planted):
    """Every outside neuron patched: the population's exact effects."""
    model, scores = planted
    return certify(model, scores.top_k(2), EXAMPLES[:3], budget=10**6, scores=scores, tau=1e-4, batch_size=64)


def test_hypergeometric_bound_is_the_exact_inversion():
    for big_n, n in ((12, 5), (30, 9)):
        for k in range(n + 1):
            for c in range(big_n + 1):
                brute = sum(math.comb(c, j) * math.comb(big_n - c, n - j) for j in range(k + 1)) / math.comb(big_n, n)
                assert hypergeom_cdf(k, big_n, c, n) == pytest.approx(brute, abs=1e-12)
            up = hypergeom_upper(k, n, big_n, 0.1)
            ok = [c for c in range(big_n + 1) if hypergeom_cdf(k, big_n, c, n) > 0.1]
            assert up == max(ok)


def test_bounds_are_exact_when_every_unit_is_patched():
    x = np.array([0.0, 0.3, 0.02, 0.5, 0.001, 0.0])
    p = plan(np.arange(6.0), budget=6, strata=2)
    b = bounds(p.sizes, p.take, [x[m] for m in p.members], tau=0.01, delta=0.05)
    assert b.count_bound == 3 and b.total_bound == pytest.approx(x.sum())


def test_coverage_on_a_tight_population_and_the_plug_in_control():
    x, s = synthetic_population(1000, 30, 0.5, seed=2, informative=False)
    row = coverage(x, s, budget=100, tau=0.01, delta=DELTA, strata=1, trials=TRIALS)
    floor = min_coverage(DELTA, TRIALS)
    assert row["count_coverage"] >= floor and row["total_coverage"] >= floor
    assert row["count_coverage"] < 1.0  # the exact bound is tight: it does fail in some trials
    assert row["estimate_coverage"] < floor  # a plug-in estimate is no bound: the check catches it
    assert row["mean_count_bound"] < 3 * row["true_count"]


@pytest.mark.parametrize("strata, top", [(1, 0), (3, 0), (1, 16)])
def test_coverage_on_the_planted_tiny_model(exhaustive, planted, strata, top):
    _, scores = planted
    x = np.maximum(np.array(exhaustive.sampled_effects), 0.0)
    s = np.array([float(scores.scores[l, i]) for l, i in exhaustive.sampled_units])
    for tau in (1e-4, 1e-5):
        row = coverage(x, s, budget=64, tau=tau, delta=DELTA, strata=strata, top=top, trials=TRIALS)
        assert row["true_count"] > 0
        assert row["count_coverage"] >= min_coverage(DELTA, TRIALS)
        assert row["total_coverage"] >= min_coverage(DELTA, TRIALS)


def test_exhaustive_certificate_is_the_truth(exhaustive):
    c = exhaustive
    x = np.maximum(np.array(c.sampled_effects), 0.0)
    assert c.n_outside == c.sampled == 4 * 128 - 2 and c.n_located == 2
    assert c.count_bound == int((x > 1e-4).sum()) and c.total_bound == pytest.approx(x.sum())
    assert PLANTED[2] in c.sampled_units and "at most" in c.summary()


@torch.no_grad()
def test_effects_are_the_hand_written_single_neuron_ablation(planted):
    model, scores = planted
    c = certify(model, scores.top_k(2), EXAMPLES, budget=3, scores=scores, seed=3)

    def mean_p(unit=None) -> float:
        out = []
        for it in encode(model, EXAMPLES):
            hooks = []
            if unit is not None:
                l, i = unit
                hooks = [(neuron_hook(l), lambda a, hook, i=i: a.index_fill(-1, torch.tensor([i]), 0.0))]
            logits = model.run_with_hooks(torch.tensor([it.prompt_ids]), fwd_hooks=hooks)
            out.append(float(logits[0, -1].softmax(-1)[it.target_ids[0]]))
        return float(np.mean(out))

    full = mean_p()
    assert c.full_metric == pytest.approx(full, abs=1e-5)
    for unit, effect in zip(c.sampled_units, c.sampled_effects):
        assert effect == pytest.approx(full - mean_p(unit), abs=1e-5)


def test_top_scored_outside_units_are_patched_whole(planted):
    model, scores = planted
    c = certify(model, scores.top_k(2), EXAMPLES[:2], budget=6, scores=scores, top=4, strata=2)
    assert c.takes[0] == c.strata[0] == 4 and sum(c.takes) == c.sampled == 6
    assert PLANTED[2] in c.sampled_units[:4]  # the third planted neuron: the best score outside the set
    with pytest.raises(ValueError, match="scores="):
        certify(model, scores.top_k(2), EXAMPLES, top=4)


def test_layers(planted):
    model, _ = planted
    c = certify(model, ci.KeySet.layers([1], n_layers=4), EXAMPLES, budget=10, tau=1e-3)
    assert c.kind == "layer" and c.n_outside == c.sampled == 3
    x = np.maximum(np.array(c.sampled_effects), 0.0)
    assert c.count_bound == int((x > 1e-3).sum())
    part = certify(model, ci.KeySet.layers([1], n_layers=4), EXAMPLES, budget=1, tau=1e-3)
    assert part.sampled == 1 and part.count_bound >= c.count_bound


def test_experts_on_a_tiny_moe():
    model, plain, _, _ = load_tiny_moe("mixtral")
    data = [Example("Rome is the capital of", " Italy"), Example("Berlin is the capital of", " Germany")]
    names = expert_keys(moe_of(model))
    n = len(expert_units(model))
    c = certify(model, ci.KeySet([(0, names[0])], "expert"), data, budget=n, tau=1e-3)
    assert c.kind == "expert" and c.n_outside == c.sampled == n - 1 and (0, names[0]) not in c.sampled_units
    x = np.maximum(np.array(c.sampled_effects), 0.0)
    assert c.count_bound == int((x > 1e-3).sum()) and c.total_bound == pytest.approx(x.sum())

    @torch.no_grad()
    def mean_p() -> float:
        ps = [model(torch.tensor([it.prompt_ids]))[0, -1].softmax(-1)[it.target_ids[0]] for it in encode(model, data)]
        return float(np.mean([float(p) for p in ps]))

    full = mean_p()
    for unit, effect in list(zip(c.sampled_units, c.sampled_effects))[:2]:  # against ci.erase of that expert
        with ci.erase(model, ci.KeySet([unit], "expert")):
            assert effect == pytest.approx(full - mean_p(), abs=1e-5)


def test_a_fitted_layer_localizer_ranks_by_its_own_layer_scores():
    model = ci.load_model("tiny", threads=1)
    facts = [Example("Rome is the capital of", " Italy", {"subject": "Rome"})]
    ct = ci.CausalTrace(model, samples=2, top_k=1, progress=False, require_correct=False).fit(facts)
    c = certify(model, ct, facts, budget=2, tau=1e-3, top=1)
    outside = [l for l in range(4) if l not in set(ct.units_)]
    best = max(outside, key=lambda l: (abs(float(ct.layer_scores_[l])), -l))
    assert c.kind == "layer" and c.strata == (1, 2) and c.takes == (1, 1) and c.sampled_units[0] == best


def test_circuit_edges():
    model = ci.load_model("tiny", threads=1)
    facts = [Example("Rome is the capital of", " Italy"), Example("Berlin is the capital of", " Germany")]
    kc = ci.KnowledgeCircuit(model, algorithm="eap", top_n=20, progress=False).fit(facts)
    n_edges = kc.circuit_.graph.n_edges
    c = certify(model, kc, facts, budget=8, tau=1e-3, top=4)
    assert c.kind == "edge" and c.n_located == int(kc.circuit_.mask.sum()) and c.n_outside == n_edges - c.n_located
    assert c.sampled == 8 and not set(c.sampled_units) & set(kc.circuit_.edges)
    assert c.count_bound >= int((np.maximum(c.sampled_effects, 0) > 1e-3).sum())
    # the same patches by hand: the graph run with one edge removed (ci.faithfulness's ablated point)
    ranked = ci.faithfulness(
        model, ci.circuits.EdgeSet([c.sampled_units[0]], kc.circuit_.graph), facts, ablation="zero"
    )
    row = ranked.table.iloc[0]
    assert c.sampled_effects[0] == pytest.approx(c.full_metric - row["ablated"], abs=1e-5)


def test_bad_input_is_refused_before_any_forward(planted):
    model, scores = planted
    s = scores.top_k(2)
    for kw, err in (
        ({"budget": 0}, ValueError),
        ({"tau": 1.0}, ValueError),
        ({"delta": 0.0}, ValueError),
        ({"ablation": "corrupt"}, ValueError),
        ({"strata": 0}, ValueError),
    ):
        with pytest.raises(err):
            certify(model, s, EXAMPLES, **kw)
    with pytest.raises(TypeError, match="top_k"):
        certify(model, scores, EXAMPLES)
    with pytest.raises(NotImplementedError, match="not 'node'"):  # heads are covered: test_certify_heads.py
        certify(model, ci.KeySet([(0, 1)], "node"), EXAMPLES)
    with pytest.raises(NotImplementedError, match="edge"):
        certify(model, ci.KeySet([("a", "b")], "edge"), EXAMPLES)
    with pytest.raises(ValueError, match="empty target"):
        certify(model, s, [Example("1+1=", "")])
    with pytest.raises(ValueError, match="not fitted"):
        certify(model, ci.DCSN(model), EXAMPLES)
