"""The convergence experiment (consistency against data size): block pooling is exact, splits are
disjoint and seeded, identical data is fully consistent, bad sizes are refused, quick mode runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

import capinterp as ci
from capinterp.data import Example
from capinterp.experiments import EXPERIMENTS, Context, ExperimentResult
from capinterp.experiments.convergence import (
    COLUMNS,
    QUICK_PLAN,
    block_scores,
    combine,
    convergence_figure,
    convergence_table,
    load_track,
    split_blocks,
    summarize,
)

SUMS = [Example(f"{a}+{b}=", str(a + b)) for a in range(1, 5) for b in range(1, 4)]  # 12 distinct prompts
FAST = {"cnl": {"steps": 2}}


def test_blocks_pool_to_a_fit_on_their_union(tiny):
    """CNL on 6 examples == the mean of its two 3-example block fits (scores are per-example means)."""
    fit = lambda exs: ci.localizers.get("cnl")(tiny, steps=2, progress=False).fit(exs).scores_  # noqa: E731
    pooled = block_scores([fit(SUMS[:3]), fit(SUMS[3:6])], 6)
    assert torch.allclose(pooled.scores, fit(SUMS[:6]).scores, rtol=1e-5, atol=1e-7)
    assert pooled.meta["n_samples"] == 6


def test_splits_are_disjoint_seeded_and_sized():
    splits = split_blocks(10, 3, 4, seed=1, tag="x")
    assert splits == split_blocks(10, 3, 4, seed=1, tag="x")
    assert splits != split_blocks(10, 3, 4, seed=2, tag="x")
    for a, b in splits:
        assert len(a) == len(b) == 3 and not set(a) & set(b) and set(a) | set(b) <= set(range(10))
    assert len({tuple(a) for a, _ in splits}) > 1  # the draws differ between splits
    with pytest.raises(ValueError, match="need 8 blocks"):
        split_blocks(7, 4, 1, seed=0)


def test_identical_data_is_fully_consistent_and_distinct_data_is_not_more(tiny):
    same = [SUMS[0]] * 12  # every block fits the same example: both halves locate the same set
    table, timing = convergence_table(
        tiny, {"same": same, "sums": SUMS}, sizes=[2, 6], block=2, n_splits=2, params=FAST, seed=0
    )
    assert list(table.columns) == COLUMNS
    assert len(table) == 2 * 2 * 2 * 2  # datasets x methods x sizes x splits
    same_rows = table[table["dataset"] == "same"]
    assert (same_rows["n_a"] > 0).all()
    assert same_rows["overlap"].eq(1.0).all() and same_rows["iou"].eq(1.0).all()
    sums = table[table["dataset"] == "sums"]
    assert sums["iou"].between(0, 1).all() and (sums["iou"] < 1).any()  # different halves, different sets
    assert set(timing) == {"same/cnl", "same/dcsn", "sums/cnl", "sums/dcsn"} and min(timing.values()) > 0
    summary = summarize(table, timing)
    assert len(summary) == 2 * 2 * 2
    row = summary[(summary["dataset"] == "same") & (summary["method"] == "cnl") & (summary["n_per_half"] == 6)]
    assert float(row["overlap_mean"].iloc[0]) == 100.0 and float(row["overlap_std"].iloc[0]) == 0.0
    # the summary rounds to 3 decimals: within 5e-4 of the exact product
    assert row["seconds_per_size"].iloc[0] == pytest.approx(12 * timing["same/cnl"], rel=1e-3, abs=6e-4)


def test_sizes_above_the_pool_are_dropped_and_bad_sizes_refused(tiny):
    table, _ = convergence_table(tiny, {"s": SUMS[:8]}, sizes=[2, 4, 8], block=2, methods=("dcsn",), n_splits=1)
    assert sorted(table["n_per_half"].unique()) == [2, 4]  # 8 per half needs 16 examples
    with pytest.raises(ValueError, match="multiple of block=2"):
        convergence_table(tiny, {"s": SUMS}, sizes=[3], block=2)
    with pytest.raises(ValueError, match="too few for two halves"):
        convergence_table(tiny, {"s": SUMS[:3]}, sizes=[2], block=2)
    with pytest.raises(ValueError, match="at least one dataset"):
        convergence_table(tiny, {}, sizes=[2], block=2)
    with pytest.raises(ValueError, match="block"):
        convergence_table(tiny, {"s": SUMS}, sizes=[2], block=0)


def test_cached_blocks_are_reused(tiny, tmp_path):
    ctx = Context(tiny, workdir=tmp_path, progress=False)
    kw = dict(sizes=[2, 4], block=2, n_splits=2, methods=("cnl",), params=FAST, localize=ctx.localize)
    first, t1 = convergence_table(tiny, {"s": SUMS[:8]}, **kw)
    files = sorted((tmp_path / "scores").glob("*.capi"))
    assert len(files) == 4  # one fit per block, shared by all sizes and splits
    stamps = [f.stat().st_mtime_ns for f in files]
    second, t2 = convergence_table(tiny, {"s": SUMS[:8]}, **kw)
    assert first.equals(second) and t1 == t2  # the recorded fit times travel with the cache
    assert [f.stat().st_mtime_ns for f in files] == stamps  # nothing was refitted


def test_quick_mode_is_registered_and_runs(tiny, tmp_path):
    assert "convergence" in EXPERIMENTS
    assert load_track(tiny, QUICK_PLAN[0], 6)[0].target.strip().lstrip("-").isdigit()
    res = EXPERIMENTS["convergence"][1](Context(tiny, quick=True, workdir=tmp_path))
    assert set(res.table["n_per_half"]) == {3, 6} and set(res.table["method"]) == {"cnl", "dcsn"}
    assert res.table["overlap_mean"].between(0, 100).all()
    assert set(res.info["first_size_reaching_90pct_overlap"]) == {"sub/cnl", "sub/dcsn"}
    assert res.info["settings"]["params"]["cnl"] == {"steps": 4}  # quick; full mode: the papers' 20


def _summary(tiny, data):
    table, timing = convergence_table(tiny, data, sizes=[2, 4], block=2, n_splits=1, methods=("dcsn",))
    return summarize(table, timing)


def test_runs_combine_into_one_table_and_one_line_per_model_dataset_method(tiny):
    a, b = _summary(tiny, {"s": SUMS[:8]}), _summary(tiny, {"s": SUMS[4:], "t": SUMS[:8]})
    both = combine([("m1", a), ("m2", b)])
    assert list(both.columns[:3]) == ["model", "dataset", "method"] and len(both) == len(a) + len(b)
    assert both[both["model"] == "m2"].drop(columns="model").reset_index(drop=True).equals(b)
    names = [t.name for t in convergence_figure(both).data]
    assert names == ["m1 / s / DCSN", "m2 / s / DCSN", "m2 / t / DCSN"]
    # one label over runs of different tracks (how a model's tracks are run apart)
    assert len(combine([("m", a), ("m", a.assign(dataset="t"))])) == 2 * len(a)
    assert [t.name for t in convergence_figure(a).data] == ["s / DCSN"]  # one run: no model in the name
    with pytest.raises(ValueError, match="more than one run"):
        combine([("m1", a), ("m1", a)])  # one model, the same track twice
    with pytest.raises(ValueError, match="lacks"):
        combine([("m1", a.drop(columns="iou_mean"))])
    with pytest.raises(ValueError, match="at least one"):
        combine([])


def test_the_script_combines_finished_runs(tiny, tmp_path):
    summary = _summary(tiny, {"s": SUMS[:8]})
    for run in ("r1", "r2"):
        ExperimentResult("convergence", "t", summary, None, {}).save(tmp_path / run / "experiments")
    script = Path(__file__).parents[2] / "scripts" / "convergence.py"
    args = [sys.executable, str(script), "--out", str(tmp_path / "all"), "--combine"]
    done = subprocess.run([*args, f"a={tmp_path / 'r1'}", f"b={tmp_path / 'r2'}"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith("| a |") or line.startswith("| b |")]
    assert len(rows) == 2 * len(summary) and rows[0].startswith("| a | s | DCSN | 2 | ")
    assert {p.name for p in (tmp_path / "all").iterdir()} == {"table.csv", "figure.json", "figure.html"}
    bad = subprocess.run([*args, f"a={tmp_path / 'nowhere'}"], capture_output=True, text=True)
    assert bad.returncode != 0 and "no finished convergence run" in bad.stderr
    bad = subprocess.run([*args, "just-a-folder"], capture_output=True, text=True)
    assert bad.returncode != 0 and "LABEL=DIR" in bad.stderr
