"""Fidelity, reliability and decoupling experiments on the tiny random model (greedy targets)."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from capinterp.core.example import Example
from capinterp.data.paraphrases import NoKnownFacts, builtin_paraphrases, known_paraphrases
from capinterp.experiments import EXPERIMENTS, Context, ExperimentSkipped
from capinterp.experiments import decoupling as D
from capinterp.experiments import fidelity as F
from capinterp.experiments import reliability as R
from capinterp.experiments._per_sample import kn_neurons, kn_scores, with_greedy_targets
from capinterp.units.neurons import NeuronScores, NeuronSet

PROMPTS = [
    ("The Eiffel Tower is in the city of", "Eiffel Tower"),
    ("The Eiffel Tower stands in the city of", "Eiffel Tower"),
    ("The capital of Italy is", "Italy"),
]  # greedy targets that round-trip on the tiny model


def _greedy(tiny, prompt: str, subject: str, fact: int = 0) -> Example:
    return with_greedy_targets(tiny, [Example(prompt, "", {"subject": subject, "fact_id": fact})])[0]


@pytest.fixture(scope="module")
def bags(tiny):
    same = [_greedy(tiny, PROMPTS[0][0], PROMPTS[0][1], 0)] * 3  # identical paraphrases
    mixed = [_greedy(tiny, p, s, 1) for p, s in PROMPTS]
    assert known_paraphrases(tiny, [same, mixed], per_fact=3) == [same, mixed]
    return [same, mixed]


def test_registered():
    assert {"fidelity", "reliability", "decoupling"} <= set(EXPERIMENTS)


def test_paraphrase_bags_hold_the_subject():
    bags = builtin_paraphrases()
    assert len(bags) == 14 and all(len(b) == 5 for b in bags)
    for bag in bags:
        assert len({e.prompt for e in bag}) == 5 and len({e.target for e in bag}) == 1
        assert all(e.meta["subject"] in e.prompt and not e.prompt.endswith(" ") for e in bag)


def test_known_paraphrases_filters(tiny, bags):
    kept = known_paraphrases(tiny, bags, per_fact=2)
    assert [len(b) for b in kept] == [2, 2]  # greedy targets: every prompt is "known"
    assert known_paraphrases(tiny, bags, max_facts=1) == [bags[0]]
    wrong = [[Example(e.prompt, " zzqx", e.meta) for e in bags[1]]]
    assert known_paraphrases(tiny, wrong, min_prompts=1, allow_empty=True) == []


def test_known_paraphrases_says_which_filter_removed_everything(tiny, bags):
    """Issue 31 item 12: ``reproduce --quick --model tiny`` failed with a bare "no facts given"."""
    wrong = [[Example(e.prompt, " zzqx", e.meta) for e in bags[1]]]
    with pytest.raises(NoKnownFacts, match=r"removed every fact: of 1 fact\(s\) \(3 prompts\)") as err:
        known_paraphrases(tiny, wrong, min_prompts=1)
    assert "facts_known_by" in str(err.value) and "answers 0 of the other 3" in str(err.value)
    one = [[bags[1][0], Example(bags[1][1].prompt, " zzqx", bags[1][1].meta)]]  # 1 answered, 2 needed
    with pytest.raises(NoKnownFacts, match="1 fact\\(s\\) keep at least one answered prompt where 2 are needed"):
        known_paraphrases(tiny, one, min_prompts=2)
    with pytest.raises(NoKnownFacts, match="no fact given"):
        known_paraphrases(tiny, [])


def test_ql_localizers_on_a_model_that_knows_nothing_names_the_filter(tiny):
    from capinterp.experiments.base import Context
    from capinterp.experiments.ql_localizers import run

    with pytest.raises(ExperimentSkipped, match="known_paraphrases removed every fact: of 3 fact") as err:
        run(Context(tiny, quick=True))
    assert isinstance(err.value.__cause__, NoKnownFacts) and "(15 prompts)" in str(err.value)


def test_fidelity_identical_paraphrases_overlap_one(tiny, bags):
    table = F.fidelity_table(tiny, bags, kn_steps=2, ct_samples=1, ct_top_k=2, kc_top_n=20)
    assert list(table.columns) == F.COLUMNS and len(table) == 3 * 2
    same = table[table["fact"] == 0]
    assert (same["mean_overlap"] == 1.0).all() and (same["identical_pairs"] == 1.0).all()
    assert ((table["mean_overlap"] >= 0) & (table["mean_overlap"] <= 1)).all()
    assert (table[table["method"] == "rome"]["mean_units"] == 2).all()
    # identical sets far beat chance: random sets of the same sizes overlap less than fully
    assert (same["mean_overlap_chance"] < same["mean_overlap"]).all()
    assert ((table["mean_iou_chance"] >= 0) & (table["mean_iou_chance"] <= table["mean_overlap_chance"])).all()
    s = F.summarize(table)
    assert list(s["method"]) == list(F.METHODS) and list(s["paper_overlap"]) == [37.3, 32.7, 7.2]
    assert ((s["overlap_ci_low"] <= s["mean_overlap"]) & (s["mean_overlap"] <= s["overlap_ci_high"])).all()
    with pytest.raises(ValueError, match="unknown method"):
        F.fidelity_table(tiny, bags, methods=["acdc"])


def test_kn_scores_cache_is_used(tiny, bags):
    store: dict[str, NeuronScores] = {}

    def cache(key, fit):
        if key not in store:
            store[key] = fit()
        return store[key]

    ex = bags[1][0]
    a = kn_scores(tiny, ex, steps=2, cache=cache)
    assert len(store) == 1 and kn_scores(tiny, ex, steps=2, cache=cache) is a
    kn_scores(tiny, ex, steps=3, cache=cache)
    assert len(store) == 2
    with pytest.raises(ValueError, match="no target"):
        kn_scores(tiny, Example("abc", ""), steps=2)


def test_erasing_nothing_changes_nothing(tiny, bags):
    exs = bags[1]
    empty = [NeuronSet.from_indices([], tiny.cfg.n_layers, tiny.cfg.d_mlp)] * len(exs)
    for pos in R.POSITIONS:
        f = R.reliability_frame(tiny, exs, neuron_sets=empty, n_random=2, position=pos)
        assert list(f.columns) == R.COLUMNS and len(f) == len(exs) * 2 * 3
        assert (f["p_after"] == f["p_before"]).all()
    s = R.summarize(f)
    assert list(s.columns) == R.SUMMARY_COLUMNS and (s["n"] == 0).all()


def test_reliability_located_and_seeded_random(tiny, bags):
    exs = bags[1]
    sets = [kn_neurons(kn_scores(tiny, e, steps=2)) for e in exs]
    assert all(len(s) > 0 for s in sets)
    a = R.reliability_frame(tiny, exs, neuron_sets=sets, n_random=2, seed=5)
    b = R.reliability_frame(tiny, exs, neuron_sets=sets, n_random=2, seed=5)
    c = R.reliability_frame(tiny, exs, neuron_sets=sets, n_random=2, seed=6)
    pd.testing.assert_frame_equal(a, b)
    rnd = a["arm"] == "random"
    assert (a.loc[~rnd, "p_after"] == c.loc[~rnd, "p_after"]).all()
    assert (a.loc[rnd, "p_after"] != c.loc[rnd, "p_after"]).any()
    assert set(a.loc[rnd, "seed"]) == {5 + 1000 * r + i for r in range(2) for i in range(len(exs))}
    erased = a[(a["arm"] == "located") & (a["factor"] == 0.0)]
    assert (erased["p_after"] != erased["p_before"]).all()
    s = R.summarize(a)
    assert list(s["n"]) == [3, 6, 3, 6]
    assert ((s["share_up"] + s["share_down"]) <= 100.0 + 1e-9).all()
    # the intervention site matters: all positions differ from the last position only
    last = R.target_prob(tiny, exs[0], sets[0], 0.0, "last")
    every = R.target_prob(tiny, exs[0], sets[0], 0.0, "all")
    assert last != every
    with pytest.raises(ValueError, match="position"):
        R.target_prob(tiny, exs[0], sets[0], 0.0, "first")


def test_decoupling_pairs_and_table(tiny):
    pairs = D.decoupling_pairs(4, seed=1)
    assert len({p[0].meta["expression"] for p in pairs}) == 4
    for compute, code in pairs:
        x = compute.meta["expression"]
        assert x in compute.prompt and x in code.prompt and compute.target == str(compute.meta["answer"])
        assert code.target == "" and compute.prompt.endswith(f"{x}=")
    sub1, sub2, flat = D.locate_pairs(tiny, pairs[:3], steps=2)
    assert all(e.target for e in flat) and len(sub1) == len(sub2) == 3
    t = D.decoupling_table(sub1, sub2)
    assert list(t["comparison"]) == list(D.COMPARISONS)
    assert list(t["n_comparisons"]) == [3, 3, 3, 6]
    same = D.decoupling_table(sub1, sub1)
    assert same.loc[0, "iou"] == 100.0 and same.loc[0, "overlap"] == 100.0
    with pytest.raises(ValueError):
        D.decoupling_table(sub1, sub2[:2])


@pytest.mark.parametrize("name", ["fidelity", "reliability"])
def test_run_quick_on_tiny_skips_with_the_filter_counts(tiny, name, tmp_path):
    """The tiny random model knows none of the builtin facts: said, with counts (not an empty table)."""
    with pytest.raises(ExperimentSkipped, match=f"{name} needs facts the model knows: known_paraphrases removed"):
        EXPERIMENTS[name][1](Context(tiny, quick=True, workdir=tmp_path))


@pytest.mark.parametrize("name", ["decoupling"])
def test_run_quick_on_tiny(tiny, name, tmp_path):
    res = EXPERIMENTS[name][1](Context(tiny, quick=True, workdir=tmp_path))
    assert res.name == name and isinstance(res.table, pd.DataFrame) and res.figure is not None
    assert res.info["notes"]
    res.save(tmp_path / "out")
    if name == "decoupling":
        assert len(res.table) == 4 and not math.isnan(res.table.loc[0, "iou"])


def test_parameter_chains_full_and_empty_circuits(tiny, bags):
    """Every edge kept: circuit-only recall is the model's own; no edge kept: nothing owned."""
    full = R.parameter_chains(tiny, bags, kc_top_n=10**9)
    assert list(full.columns) == R.CHAIN_COLUMNS and len(full) == len(bags)
    assert (full["hit@1_zero"] == full["full_hit@1"]).all() and (full["hit@1_corrupt"] == full["full_hit@1"]).all()
    assert full["full_hit@1"].eq(1.0).all()  # greedy targets: the model's own top-1
    assert full["param_share"].between(0.5, 1.0).all()  # every block's heads and MLPs
    empty = R.parameter_chains(tiny, bags, kc_top_n=0)
    assert empty["n_edges"].eq(0).all() and empty["param_share"].eq(0.0).all()
    some = R.parameter_chains(tiny, bags, kc_top_n=20)
    assert (some["n_edges"] <= 20).all() and (some["param_share"] < full["param_share"]).all()
