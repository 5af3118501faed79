"""The capability experiments (commonality, erase, cross_capability) and their shared pieces, on
tiny models: table shapes, and properties that must hold (identical halves overlap fully, erasing
nothing changes nothing, seeded random arms repeat, pooled halves equal a fit on the union)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from planting import PLANTED, plant_answer

import capinterp as ci
from capinterp.core.tokens import encode
from capinterp.data import Example
from capinterp.data.parsing import is_correct
from capinterp.experiments import EXPERIMENTS, Context
from capinterp.experiments import capability_data as cd
from capinterp.experiments.commonality import COLUMNS as COMMON_COLS
from capinterp.experiments.commonality import commonality_table
from capinterp.experiments.cross_capability import COLUMNS as CROSS_COLS
from capinterp.experiments.cross_capability import cross_figure, cross_matrix, cross_table
from capinterp.experiments.erase import COLUMNS as ERASE_COLS
from capinterp.experiments.erase import erase_figure, erase_table, random_sets
from capinterp.experiments.scoring import greedy_accuracy, measure, surely_wrong, target_scores
from capinterp.units.neurons import NeuronScores, NeuronSet

SEVENS = [Example(f"{a}+{b}=", "7") for a, b in [(3, 4), (5, 2), (1, 6), (2, 5), (6, 1), (4, 3)]]
PROMPTS = ["3+4=", "12*3=", "5-2=", "8/4=", "9+9=", "7*7=", "6-1=", "4+5="]
FAST = {"cnl": {"steps": 2}}


@pytest.fixture(scope="module")
def planted():
    m = ci.load_model("tiny")
    plant_answer(m, SEVENS)
    return m


def _all(model) -> NeuronSet:
    return NeuronSet(torch.ones(model.cfg.n_layers, model.cfg.d_mlp, dtype=torch.bool))


def test_experiments_are_registered():
    assert {"commonality", "erase", "cross_capability"} <= set(EXPERIMENTS)


def test_target_scores_match_greedy_targets(tiny):
    exs = cd.fill_greedy_targets(tiny, ci.data.as_examples(PROMPTS))  # target = greedy next token
    exs = [e for e in exs if "\ufffd" not in e.target]  # a lone partial UTF-8 byte does not round-trip
    assert len(exs) >= 3
    s = target_scores(tiny, exs, batch_size=3)
    assert s["match"].tolist() == [1.0] * len(exs)
    ev = ci.evaluate(tiny, exs, progress=False)
    assert np.allclose(s["first_prob"], [r["prob"] for r in ev.records], atol=1e-5)
    with pytest.raises(ValueError, match="metric"):
        measure(tiny, exs, "bleu")


def test_greedy_accuracy_equals_evaluate(tiny, planted):
    greedy = [e for e in cd.fill_greedy_targets(tiny, ci.data.as_examples(PROMPTS)) if "\ufffd" not in e.target]
    wrong = [Example(e.prompt, "x" if e.target != "x" else "y") for e in greedy]
    digits = [Example(p, "4", {"fmt": "DG", "answer": 4}) for p in PROMPTS[:3]]
    for model, exs in ((tiny, greedy + wrong + digits), (planted, SEVENS + [Example("3+4=", "8")])):
        ev = ci.evaluate(model, exs, progress=False)
        assert greedy_accuracy(model, exs) == pytest.approx(ev.accuracy)
        assert 0.0 < ev.accuracy < 1.0


@pytest.mark.parametrize(
    "target,fmt,first,wrong",
    [
        (" positive", None, " negative", True),
        (" positive", None, " pos", False),
        (" positive", None, "\n", False),
        (" positive", None, "positive!", False),
        ("12", "DG", "1", False),
        ("12", "DG", "3", True),
        ("12", "DG", " x", True),
        ("12", "DG", "0", False),
        ("12", "DG", "-", False),
        ("-3", "DG", "3", True),
        ("A", "MQ", "B", False),
        ("否", None, "\ufffd", False),
    ],
)
def test_surely_wrong_decides_only_settled_cases(target, fmt, first, wrong):
    ex = Example("q", target, {"fmt": fmt} if fmt else {})
    assert surely_wrong(ex, first) is wrong
    if wrong:  # any continuation after such a first token is judged wrong
        for rest in ("", "2", " positive", "\n12"):
            assert not is_correct(ex, first + rest)


def test_identical_halves_overlap_fully(tiny):
    same = ["3+4="] * 6  # both halves hold the same three copies -> identical scores
    t = commonality_table(tiny, {"same": same}, params=FAST, sigma=2.0)
    assert list(t.columns) == COMMON_COLS and len(t) == 2
    assert t["method"].tolist() == ["cnl", "dcsn"]
    assert (t["n_a"] > 0).all() and (t["n_a"] == t["n_b"]).all() and (t["n_common"] == t["n_a"]).all()
    assert t["overlap"].tolist() == [1.0, 1.0] and t["iou"].tolist() == [1.0, 1.0]
    # beside it, what two random sets of the same sizes would score, and the p-value of the overlap
    assert (t["overlap_chance"] < 0.5).all() and (t["iou_chance"] <= t["overlap_chance"]).all()
    assert (t["p_value"] < 1e-3).all()


def test_split_halves_are_cached_and_reused(tiny, tmp_path):
    ctx = Context(tiny, workdir=tmp_path)
    t1 = commonality_table(tiny, {"mix": PROMPTS}, methods=("dcsn",), sigma=2.0, localize=ctx.localize)
    saved = sorted(p.name for p in (tmp_path / "scores").glob("*.capi"))
    assert len(saved) == 2  # one fit per half
    t2 = commonality_table(tiny, {"mix": PROMPTS}, methods=("dcsn",), sigma=2.0, localize=ctx.localize)
    assert t1.equals(t2) and sorted(p.name for p in (tmp_path / "scores").glob("*.capi")) == saved
    r = t1.iloc[0]
    assert 0.0 <= r["iou"] <= r["overlap"] <= 1.0 and r["n_per_half"] == 4


def test_pooled_halves_equal_a_fit_on_the_union(tiny):
    exs = cd.fill_greedy_targets(tiny, ci.data.as_examples(PROMPTS))
    a, b = cd.halves(exs, seed=3)
    loc = cd.default_localize(tiny)
    sa, sb = cd.half_scores(loc, "dcsn", "x", exs, seed=3)
    union = ci.DCSN(tiny, progress=False).fit(a + b).scores_.scores
    assert torch.allclose(cd.pooled(sa, sb, len(a), len(b)).scores, union, atol=1e-6)
    assert not set(e.prompt for e in a) & set(e.prompt for e in b)


def test_erasing_nothing_changes_nothing(tiny):
    flat = NeuronScores(torch.zeros(tiny.cfg.n_layers, tiny.cfg.d_mlp))  # no neuron beyond sigma
    exs = cd.fill_greedy_targets(tiny, ci.data.as_examples(PROMPTS))
    t = erase_table(
        tiny,
        {"acc": flat, "prob": flat},
        {"acc": exs, "prob": exs},
        metrics_by_name={"acc": "accuracy", "prob": "target_prob"},
        sigmas=(3.0, 6.0),
        n_random=2,
    )
    assert list(t.columns) == ERASE_COLS and len(t) == 4
    assert (t["n_neurons"] == 0).all()
    for col in ("located", "random_mean", "random_min", "random_max"):
        assert np.allclose(t[col], t["base"])
    assert np.allclose(t["located_prob"], t["base_prob"]) and np.allclose(t["ipp"], 0.0)
    assert t.loc[t["capability"] == "acc", "base"].iloc[0] == 1.0  # greedy targets: all correct


def test_random_arms_use_the_seed(tiny):
    g = torch.Generator().manual_seed(0)
    ns = NeuronScores(torch.randn(tiny.cfg.n_layers, tiny.cfg.d_mlp, generator=g)).select(sigma=2.0)
    r1, r2, other = random_sets(ns, 3, seed=1), random_sets(ns, 3, seed=1), random_sets(ns, 3, seed=2)
    assert r1 == r2 and r1 != other and all(len(r) == len(ns) for r in r1)
    assert r1[0] != r1[1]


def test_erasing_planted_neurons_beats_random(planted):
    mask = torch.zeros(planted.cfg.n_layers, planted.cfg.d_mlp)
    for layer, i in PLANTED:
        mask[layer, i] = 10.0
    scores = NeuronScores(mask)
    t = erase_table(planted, {"seven": scores}, {"seven": SEVENS}, sigmas=(6.0,), n_random=3, seed=0)
    r = t.iloc[0]
    assert r["n_neurons"] == 3 and r["metric"] == "accuracy"
    assert r["base"] == 1.0 and r["located"] == 0.0 and r["random_min"] == 1.0
    assert r["ipp"] == pytest.approx(1.0)
    again = erase_table(planted, {"seven": scores}, {"seven": SEVENS}, sigmas=(6.0,), n_random=3, seed=0)
    assert t.equals(again)
    assert len(erase_figure(t).data) == 2


def test_cross_table_shape_and_controls(tiny):
    exs = cd.fill_greedy_targets(tiny, ci.data.as_examples(PROMPTS))
    empty = NeuronSet(torch.zeros(tiny.cfg.n_layers, tiny.cfg.d_mlp, dtype=torch.bool))
    tests = {"a": exs[:4], "b": exs[4:]}
    t = cross_table(
        tiny, {"none": empty, "all": _all(tiny)}, tests, metrics_by_name={"a": "target_prob", "b": "target_prob"}
    )
    assert list(t.columns) == CROSS_COLS and len(t) == 4
    none = t[t["erased"] == "none"]
    assert np.allclose(none["rel_drop"], 0.0) and np.allclose(none["rel_drop_random"], 0.0)
    full = t[t["erased"] == "all"]
    assert (full["after"] != full["base"]).all()  # erasing every neuron changes the model
    assert t["set_overlap"].isna().all()  # the tested capabilities have no sets of their own here
    both = cross_table(
        tiny,
        {"a": empty, "b": _all(tiny)},
        tests,
        random_control=False,
        metrics_by_name={"a": "target_prob", "b": "target_prob"},
    )
    assert both["set_overlap"].tolist() == [1.0, 0.0, 0.0, 1.0] and both["after_random"].isna().all()
    m = cross_matrix(t)
    assert list(m.index) == ["none", "all"] and list(m.columns) == ["a", "b"]
    assert len(cross_figure(t).data) == 2


def test_solved_first_orders_and_counts(planted):
    mixed = [Example("3+4=", "7"), Example("3+4=", "8")] * 2
    kept, n_solved = cd.solved_first(planted, mixed, "accuracy", n_keep=3)
    assert n_solved == 2 and [e.target for e in kept] == ["7", "7", "8"]


def test_cut_targets_keeps_the_first_tokens(tiny):
    long = [Example("def f(x):", "\n    return x + 1"), Example("1+1=", "2")]
    # "\n" and 4 spaces are context (whitespace-only tokens); the answer tokens are "r", "e", "t", ...
    cut = cd.cut_targets(tiny, long, 3)
    ids = encode(tiny, long)[0].target_ids
    assert encode(tiny, cut)[0].target_ids == ids[:3] and len(ids) > 3
    assert cut[0].target == "\n    ret"
    assert cut[0].meta["target_full"] == long[0].target and cut[1] == long[1]
    assert cd.cut_targets(tiny, long, 99) == long


def test_prepare_is_memoized_and_held_out(tiny):
    def loader(name, n, seed=0, split="test"):
        off = 0 if split == "train" else 100
        return [Example(f"{off + i}+1=", str(off + i + 1), {"fmt": "DG", "answer": off + i + 1}) for i in range(n)]

    d = cd.prepare(tiny, ["add"], n_candidates=6, n_locate=4, n_test=3, loader=loader)
    assert len(d["add"].locate) == 4 and len(d["add"].test) == 3 and d["add"].metric == "accuracy"
    assert not {e.prompt for e in d["add"].locate} & {e.prompt for e in d["add"].test}
    assert cd.prepare(tiny, ["add"], n_candidates=6, n_locate=4, n_test=3, loader=loader)["add"] is d["add"]


def test_three_experiments_share_fits_in_a_reproduction(tiny, tmp_path, monkeypatch):
    from capinterp.app.reproduce import reproduce

    small = {
        "capabilities": ("add", "sub"),
        "n_candidates": 6,
        "n_locate": 4,
        "n_test": 4,
        "params": {"cnl": {"steps": 2}, "dcsn": {}},
    }
    monkeypatch.setattr(cd, "settings", lambda ctx: dict(small))
    names = ["commonality", "erase", "cross_capability"]
    res = reproduce(tiny, tmp_path, quick=True, only=names[:1], log=lambda m: None)
    fits = sorted((tmp_path / "cache" / "scores").glob("*.capi"))
    assert len(fits) == 2 * 2 * 2  # capabilities x methods x halves
    res = reproduce(tiny, tmp_path, quick=True, only=names, log=lambda m: None)
    assert sorted((tmp_path / "cache" / "scores").glob("*.capi")) == fits  # erase / cross refit nothing
    for name in names:
        assert "error" not in res["experiments"][name], res["experiments"][name].get("traceback")
    assert len(res["experiments"]["commonality"]["table"]) == 4
    assert len(res["experiments"]["erase"]["table"]) == 2 * 2  # capabilities x quick sigmas (3, 6)
    assert len(res["experiments"]["cross_capability"]["table"]) == 4


def test_enhance_trains_the_planted_neurons_best(planted):
    from capinterp.experiments.enhance import columns, enhance_figure, enhance_table

    eights = [Example(e.prompt, "8") for e in SEVENS]  # the planted neurons fire here and write "7"
    neurons = NeuronSet.from_indices(PLANTED, planted.cfg.n_layers, planted.cfg.d_mlp)
    before = measure(planted, eights, "target_prob")["value"]
    lr = {"located": 3e-2, "random": 3e-2, "without_located": 1e-3}
    t = enhance_table(
        planted,
        {"eight": neurons},
        {"eight": eights},
        {"eight": eights},
        metrics_by_name={"eight": "target_prob"},
        epochs=3,
        lr=lr,
    )
    assert list(t.columns) == columns() and len(t) == 1
    r = t.iloc[0]
    assert r["base"] == pytest.approx(before) and r["n_neurons"] == 3
    assert r["gain_located"] > 0.2 and r["gain_located"] > 2 * max(r["gain_random"], 0.0)
    assert measure(planted, eights, "target_prob")["value"] == pytest.approx(before)  # caller's model untouched
    assert len(enhance_figure(t).data) == 4
    only = enhance_table(
        planted,
        {"eight": neurons},
        {"eight": eights},
        {"eight": eights},
        metrics_by_name={"eight": "target_prob"},
        epochs=1,
        lr=lr,
        arms=("located",),
    )
    assert list(only.columns) == columns(("located",))


@pytest.mark.parametrize("quick", [True, False])
def test_enhance_quick_trains_fewer_capabilities(planted, monkeypatch, quick):
    from capinterp.experiments.enhance import CAPABILITIES, QUICK_CAPABILITIES
    from capinterp.experiments.enhance import run as run_enhance

    def prepared(ctx, s):
        return {k: cd.CapabilityData(k, "target_prob", SEVENS[:4], SEVENS[4:]) for k in s["capabilities"]}

    def located(localize, method, data, seed=0, **params):
        s = torch.zeros(planted.cfg.n_layers, planted.cfg.d_mlp)
        s[0, 1] = 1.0  # one neuron far above the rest: sigma 6 keeps it
        return NeuronScores(s)

    monkeypatch.setattr(cd, "prepared", prepared)
    monkeypatch.setattr(cd, "located_scores", located)
    res = run_enhance(Context(model=planted, quick=quick))
    assert len(QUICK_CAPABILITIES) < len(CAPABILITIES)
    assert list(res.table["capability"]) == list(QUICK_CAPABILITIES if quick else CAPABILITIES)
    assert ("quick_note" in res.info) == quick and res.info["settings"]["epochs"] == (1 if quick else 2)
