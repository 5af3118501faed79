"""The papers/003 experiments (specificity, forward reasoning, operator ablation) on the tiny model."""

from __future__ import annotations

import math

import pytest
import torch

import capinterp as ci
from capinterp.core.tokens import encode
from capinterp.data import Example
from capinterp.experiments.base import Context, ExperimentResult
from capinterp.experiments.dcsn_common import correct_scores, sample_scores, top_fraction, union
from capinterp.experiments.forward_reasoning import (
    activation_mask,
    activation_ratio,
    forward_reasoning_table,
    operator_ratio,
    reverse_validation,
)
from capinterp.experiments.forward_reasoning import (
    run as run_forward,
)
from capinterp.experiments.operator_ablation import ablation_matrix, drop_matrix, per_op
from capinterp.experiments.operator_ablation import run as run_ablation
from capinterp.experiments.specificity import (
    QUICK_CONDITIONS,
    QUICK_NEFT_CONDITIONS,
    compare_sets,
    pool_scores,
    specificity_table,
)
from capinterp.experiments.specificity import (
    run as run_specificity,
)
from capinterp.localizers.dcsn import last_token_activations
from capinterp.units.neurons import NeuronScores, NeuronSet

SHAPE = (4, 128)


def _set(pairs, shape=SHAPE) -> NeuronSet:
    return NeuronSet.from_indices(pairs, *shape)


def _greedy_examples(model, examples):
    """Copies of ``examples`` whose target is the model's greedy first token (first-token right)."""
    _, logits = last_token_activations(model, encode(model, examples))
    tokens = logits.argmax(-1).tolist()
    return [
        Example(e.prompt, model.tokenizer.decode([t]), {**e.meta, "target_from": "greedy"})
        for e, t in zip(examples, tokens)
    ]


# --- dcsn_common ---------------------------------------------------------------------------------
def test_correct_scores_equal_dcsn_on_the_right_examples(tiny):
    wrong = ci.data.arithmetic(ops="+-", n=4, seed=0)
    right = _greedy_examples(tiny, ci.data.arithmetic(ops="*", n=3, seed=1))
    flags = torch.cat([ok for _, _, ok in sample_scores(tiny, wrong + right, batch_size=3)])
    assert flags.tolist() == [False] * 4 + [True] * 3
    got = correct_scores(tiny, wrong + right, batch_size=3)
    ref = ci.DCSN(tiny, progress=False).fit(right).scores_
    assert torch.allclose(got.scores, ref.scores, atol=1e-6, rtol=1e-5)
    assert got.meta["n_samples"] == 3 and got.meta["n_offered"] == 7 and not got.meta["filter_fallback"]
    every = correct_scores(tiny, wrong + right, filter="none")
    assert torch.allclose(every.scores, ci.DCSN(tiny, progress=False).fit(wrong + right).scores_.scores, atol=1e-6)
    fallback = correct_scores(tiny, wrong)  # nothing right: all examples are used, and it says so
    assert fallback.meta["filter_fallback"] and fallback.meta["n_samples"] == 4
    with pytest.raises(ValueError):
        correct_scores(tiny, wrong, filter="nope")
    folded = correct_scores(tiny, wrong + right, batch_size=3, norms="fold")
    ref = ci.DCSN(tiny, norms="fold", progress=False).fit(right).scores_
    assert torch.allclose(folded.scores, ref.scores, atol=1e-6, rtol=1e-5)
    assert not torch.allclose(folded.scores, got.scores) and folded.meta["params"]["norms"] == "fold"
    with pytest.raises(ValueError, match="norms must be one of"):
        correct_scores(tiny, wrong, norms="nope")


def test_top_fraction_keeps_the_largest_deviations_inside_the_set():
    s = torch.zeros(SHAPE)
    s[0, :5] = torch.tensor([5.0, -9.0, 1.0, 3.0, -2.0])
    s[1, 0] = 100.0  # largest deviation, but outside the set
    scores, ns = NeuronScores(s), _set([(0, i) for i in range(5)])
    assert set(top_fraction(scores, ns, 0.4)) == {(0, 0), (0, 1)}  # ceil(0.4 * 5) = 2
    assert set(top_fraction(scores, ns, 0.1)) == {(0, 1)}  # at least one
    assert top_fraction(scores, ns, 1.0) == ns
    assert len(top_fraction(scores, _set([]), 0.1)) == 0
    assert union([_set([(0, 1)]), _set([(2, 3)])], ns) == _set([(0, 1), (2, 3)])


# --- specificity -------------------------------------------------------------------------------------
def test_compare_sets_identical_and_disjoint():
    a, b = _set([(0, 1), (1, 2), (3, 4)]), _set([(2, 5), (2, 6)])
    sets = {("+", "X"): a, ("+", "Y"): a, ("-", "X"): a, ("-", "Y"): b}
    t = compare_sets(sets, [("X", "Y", "format")])
    assert list(t.columns) == [
        "metric",
        "kind",
        "comparison",
        "op_a",
        "op_b",
        "n_a",
        "n_b",
        "intersection",
        "value",
        "iou",
        "overlap",
        "paper_pair",
    ]
    coh = t[t.metric == "cohesion"].set_index("op_a")
    assert coh.loc["+", "value"] == 1.0 and coh.loc["+", "iou"] == 1.0  # same set twice
    assert coh.loc["-", "value"] == 0.0 and coh.loc["-", "overlap"] == 0.0  # disjoint sets
    sep = t[t.metric == "separability"].set_index("comparison")
    assert sep.loc["X", "value"] == 1.0 and sep.loc["Y", "value"] == 0.0
    assert bool(sep.loc["X", "paper_pair"])  # "+" vs "-" is one of the paper's four pairs


def test_specificity_table_on_tiny(tiny):
    data = {(op, "A"): ci.data.arithmetic(ops=op, n=4, fmt="DG", seed=0) for op in "+*"}
    data.update({(op, "B"): ci.data.arithmetic(ops=op, n=4, fmt="TF", seed=0) for op in "+*"})
    pairs = [("A", "A", "self"), ("A", "B", "format"), ("A", "P", "pool")]
    t = specificity_table(tiny, data, pairs=pairs, pools={"P": ["A"]}, sigma=3)
    assert len(t) == 2 * 3 + 3  # 2 ops x 3 pairs cohesion, 1 op pair x 3 conditions (A, B, P)
    self_coh = t[(t.metric == "cohesion") & (t.kind.isin(["self", "pool"]))]
    assert (self_coh["value"] == 1.0).all() and (self_coh["n_a"] > 0).all()
    assert t["value"].between(0, 1).all() and (t["overlap"] >= t["value"]).all() and (t["value"] >= t["iou"]).all()


def test_pool_scores_weight_by_examples_used():
    a = NeuronScores(torch.ones(SHAPE), {"n_samples": 1})
    b = NeuronScores(torch.full(SHAPE, 4.0), {"n_samples": 3})
    pooled = pool_scores({("+", "a"): a, ("+", "b"): b}, {"P": ["a", "b"]})[("+", "P")]
    assert torch.allclose(pooled.scores, torch.full(SHAPE, 3.25)) and pooled.meta["n_samples"] == 4


# --- forward reasoning ----------------------------------------------------------------------------------
def test_activation_mask_and_ratio_by_hand():
    scores = torch.zeros(1, 2, 4)
    scores[0, 1, 3] = 10.0  # |10 - mean 1.25| = 8.75 = 2.65 population std (3.307), 2.47 sample std
    active = activation_mask(scores, sigma=2.55)[0]
    assert active.nonzero().tolist() == [[1, 3]]
    sets = {
        "+": _set([(0, 0), (1, 3)], (2, 4)),
        "*": _set([(1, 3)], (2, 4)),
        "-": _set([(0, 2)], (2, 4)),
        "/": _set([], (2, 4)),
    }
    assert operator_ratio(active, sets, ["+", "*"]) == pytest.approx((1 / 2 + 1 / 1) / 2)
    assert operator_ratio(active, sets, ["-"]) == 0.0
    assert math.isnan(operator_ratio(active, sets, ["/"]))  # empty sets are skipped


def test_activation_ratio_matches_slow_reference(tiny):
    examples = ci.data.arithmetic(ops="+-*/", n=6, fmt="DG", n_ops=2, seed=3)
    sigma = 3.0
    loc = ci.DCSN(tiny, sigma=2.0, progress=False)
    op_sets = {op: loc.clone().fit([e for e in examples if op in e.meta["op_set"]]).neurons_ for op in "+-*/"}
    fast = activation_ratio(tiny, examples, op_sets, sigma=sigma, batch_size=4)
    assert list(fast.columns) == ["index", "n_ops", "ops", "R", "R_absent", "n_active", "chance"]
    for e, row in zip(examples, fast.itertuples()):
        active = ci.DCSN(tiny, sigma=sigma, progress=False).fit([e]).neurons_  # single-sample Eq. 2
        fr = [
            ci.metrics.intersection_size(op_sets[o], active) / len(op_sets[o])
            for o in e.meta["op_set"]
            if len(op_sets[o])
        ]
        assert pytest.approx(sum(fr) / len(fr), abs=1e-9) == row.R
        assert row.n_active == len(active)
    assert 0 < fast["R"].max() <= 1  # the test is not vacuous


def test_reverse_validation_empty_erasure_changes_nothing_and_random_uses_seed(tiny):
    examples = ci.data.arithmetic(ops="+-*/", n=6, fmt="DG", n_ops=2, seed=1)
    empty = {op: _set([]) for op in "+-*/"}
    t = reverse_validation(tiny, examples, empty, seed=0, batch_size=8)
    assert t["n"].sum() == 6 and (t["n_erased"] == 0).all()
    assert (t["acc_erased"] == t["acc_orig"]).all() and (t["prob_erased"] - t["prob_orig"]).abs().max() < 1e-6
    big = {
        op: NeuronSet(torch.rand(SHAPE, generator=torch.Generator().manual_seed(i)) < 0.2)
        for i, op in enumerate("+-*/")
    }
    r0, r0b, r1 = (reverse_validation(tiny, examples, big, seed=s, batch_size=8) for s in (0, 0, 1))
    assert r0["prob_random"].tolist() == r0b["prob_random"].tolist()
    assert r0["prob_random"].tolist() != r1["prob_random"].tolist()
    assert (r0["prob_erased"] != r0["prob_orig"]).any()


def test_forward_reasoning_table_columns(tiny):
    data = {k: ci.data.arithmetic(ops="+-*/", n=3, fmt="DG", n_ops=k, seed=0) for k in (2, 5)}
    sets = {op: _set([(0, i), (1, i)]) for i, op in enumerate("+-*/")}
    t = forward_reasoning_table(tiny, data, sets, sets, sigma=3.0)
    assert t["n_ops"].tolist() == [2, 5] and t["n"].tolist() == [3, 3]
    assert {"R", "R_absent", "chance", "acc_orig", "acc_erased", "acc_random", "prob_orig"} <= set(t.columns)
    assert math.isnan(t.set_index("n_ops").loc[5, "R_absent"])  # every operator is present in 5-OP


# --- operator ablation ----------------------------------------------------------------------------------
def test_ablation_matrix_shape_empty_erasure_and_random_size(tiny):
    tests = {op: ci.data.arithmetic(ops=op, n=2, seed=5) for op in "+-*/"}
    empty = {op: _set([]) for op in "+-*/"}
    t = ablation_matrix(tiny, tests, empty, seed=0, batch_size=8)
    assert len(t) == 5 * 4 and drop_matrix(t).shape == (5, 4)
    assert list(drop_matrix(t).index) == ["+", "-", "*", "/", "random"]
    assert (t["drop"] == 0).all() and t["prob_drop"].abs().max() < 1e-6
    sizes = {op: _set([(0, j) for j in range(i + 1)]) for i, op in enumerate("+-*/")}
    t2 = ablation_matrix(tiny, tests, sizes, seed=0, batch_size=8)
    rnd = t2[t2.erased == "random"].set_index("test_op")["n_erased"]
    assert rnd.to_dict() == {"+": 1, "-": 2, "*": 3, "/": 4}  # same count as that operator's set


# --- run(ctx) end to end (quick mode, tiny model) ----------------------------------------------------------
@pytest.mark.parametrize("runner", [run_specificity, run_forward, run_ablation])
def test_runs_save_and_load(tiny, tmp_path, runner):
    ctx = Context(model=tiny, quick=True, workdir=tmp_path / "cache")
    res = runner(ctx)
    assert isinstance(res, ExperimentResult) and len(res.table) > 0 and res.figure is not None
    assert "paper" in res.info and "notes" in res.info
    back = ExperimentResult.load(res.save(tmp_path / "out").parent, res.name)
    assert back.table.shape == res.table.shape and set(back.neurons) == set(res.neurons)
    assert any((tmp_path / "cache" / "scores").glob("*.capi"))  # fitted scores are cached


def test_operator_neurons_are_shared_through_the_cache(tiny, tmp_path):
    ctx = Context(model=tiny, quick=True, workdir=tmp_path)
    run_specificity(ctx)
    before = sorted(p.name for p in (tmp_path / "scores").glob("*.capi"))
    run_ablation(ctx)  # its 1-OP DG (en) operator neurons are specificity's "DG-en" sets
    assert sorted(p.name for p in (tmp_path / "scores").glob("*.capi")) == before


def test_per_op_equals_evaluate(tiny):
    tests = {op: ci.data.arithmetic(ops=op, n=5, seed=3) for op in "+*"}
    from capinterp.localizers.dataset import fill_greedy_targets

    right = fill_greedy_targets(tiny, ci.data.as_examples([e.prompt for e in ci.data.arithmetic("+", 4, seed=4)]))
    tests["+"] += [e for e in right if "\ufffd" not in e.target]  # plain-text targets greedy reproduces
    got = per_op(tiny, tests, list(tests), batch_size=4)
    for op, exs in tests.items():
        ev = ci.evaluate(tiny, exs, progress=False)
        assert got[op] == pytest.approx((ev.accuracy, ev.mean_prob), abs=1e-5)
    assert got["+"][0] > 0


def test_specificity_neft_rows_match_dcsn_sizes(tiny, tmp_path):
    res = run_specificity(Context(model=tiny, quick=True, workdir=tmp_path))
    t = res.table
    assert set(t.method) == {"dcsn", "neft"}
    key = ["metric", "comparison", "op_a", "op_b"]
    d = t[t.method == "dcsn"].set_index(key)
    n = t[t.method == "neft"].set_index(key)
    # quick mode: NeFT on the resample pair's conditions only, the same comparisons as DCSN there
    conds = set(res.info["neft"]["conditions"])
    assert conds == set(QUICK_NEFT_CONDITIONS) and len(conds) < len(QUICK_CONDITIONS)
    assert res.info["neft"]["steps"] == 1  # quick: the 6 examples are one batch, one SGD step
    mine = [all(c in conds for c in comp.split(" vs ")) for comp in d.index.get_level_values("comparison")]
    assert d[mine].index.equals(n.index) and len(n) > 0
    assert set(n.index.get_level_values("metric")) == {"cohesion", "separability"}
    assert (d.loc[n.index, "n_a"] == n["n_a"]).all() and (d.loc[n.index, "n_b"] == n["n_b"]).all()  # like-sized
    assert not any("TF" in k for k in res.neurons if k.startswith("neft_"))
    assert res.info["measured_neft"].keys() == res.info["measured"].keys()
    assert any(k.startswith("neft_") for k in res.neurons)
    assert any(p.name.startswith("neft_") for p in (tmp_path / "scores").glob("*.capi"))
