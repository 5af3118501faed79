"""The reproduction runner: runs registered experiments, resumes, refuses a mismatched folder."""

from __future__ import annotations

import json

import pandas as pd
import plotly.graph_objects as go
import pytest

from capinterp.app.cli import main as cli
from capinterp.app.reproduce import reproduce
from capinterp.data import Example
from capinterp.data.paraphrases import known_paraphrases
from capinterp.experiments import EXPERIMENTS, Context, ExperimentResult, experiment
from capinterp.units.neurons import NeuronScores

CALLS: list[str] = []


@pytest.fixture
def toy_experiments():
    """Two throwaway experiments (one fails), removed from the registry afterwards."""
    before = dict(EXPERIMENTS)

    @experiment("toy_ok", "Toy experiment")
    def ok(ctx: Context) -> ExperimentResult:
        CALLS.append("ok")
        n = ctx.size(2, 5)
        scores = ctx.scores("toy", lambda: _scores(ctx.model))
        table = pd.DataFrame({"i": range(n), "top": [float(scores.scores.max())] * n})
        fig = go.Figure(go.Bar(x=table["i"], y=table["top"]))
        return ExperimentResult("toy_ok", "Toy experiment", table, fig, {"paper": {"x": 1.0}}, {"top": scores.top_k(3)})

    @experiment("toy_fail", "Failing experiment")
    def fail(ctx: Context) -> ExperimentResult:
        CALLS.append("fail")
        raise RuntimeError("boom")

    @experiment("toy_unknown", "Needs known facts")
    def unknown(ctx: Context) -> ExperimentResult:
        CALLS.append("unknown")
        known_paraphrases(ctx.model, [[Example("The Eiffel Tower is in the city of", " zzqx")] * 2])
        raise AssertionError("not reached: the tiny model does not answer ' zzqx'")

    CALLS.clear()
    yield
    EXPERIMENTS.clear()
    EXPERIMENTS.update(before)


def _scores(model) -> NeuronScores:
    CALLS.append("fit")
    import torch

    from capinterp.core.fingerprint import model_fingerprint

    g = torch.Generator().manual_seed(0)  # scores carry their model's identity, as every fit's do
    meta = {"model_fingerprint": model_fingerprint(model)}
    return NeuronScores(torch.rand(model.cfg.n_layers, model.cfg.d_mlp, generator=g), meta)


def test_runs_resumes_and_reports(tiny, tmp_path, toy_experiments):
    res = reproduce(tiny, tmp_path, quick=True, only=["toy_ok", "toy_fail"], log=lambda m: None)
    assert CALLS == ["ok", "fit", "fail"]
    assert len(res["experiments"]["toy_ok"]["table"]) == 2  # quick size
    assert "boom" in res["experiments"]["toy_fail"]["error"]
    report = (tmp_path / "report.html").read_text()
    assert "Toy experiment" in report and "boom" in report and "plotly" in report
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["config"]["quick"] is True
    assert (tmp_path / "experiments" / "toy_ok" / "neurons" / "top.capi").exists()

    CALLS.clear()  # rerun: the finished experiment is loaded, the failed one is retried
    res2 = reproduce(tiny, tmp_path, quick=True, only=["toy_ok", "toy_fail"], log=lambda m: None)
    assert CALLS == ["fail"]
    assert res2["experiments"]["toy_ok"]["table"] == res["experiments"]["toy_ok"]["table"]
    assert res2["experiments"]["toy_ok"]["resumed"] is True

    CALLS.clear()  # the cached scores survive a deleted experiment folder: no refit
    import shutil

    shutil.rmtree(tmp_path / "experiments" / "toy_ok")
    reproduce(tiny, tmp_path, quick=True, only=["toy_ok"], log=lambda m: None)
    assert CALLS == ["ok"]


def test_an_experiment_whose_fact_filter_removes_everything_is_skipped_with_the_counts(tiny, tmp_path, toy_experiments):
    """Issue 31 item 12: ql_localizers on tiny said only "no facts given"."""
    logs: list[str] = []
    res = reproduce(tiny, tmp_path, quick=True, only=["toy_unknown"], log=logs.append)
    entry = res["experiments"]["toy_unknown"]
    assert "error" not in entry and "known_paraphrases removed every fact: of 1 fact(s) (2 prompts)" in entry["skipped"]
    assert any("toy_unknown SKIPPED: toy_unknown needs facts the model knows" in m for m in logs)
    assert "skipped: toy_unknown needs facts" in (tmp_path / "report.html").read_text()


@pytest.mark.parametrize("damage", ["table", "info", "neurons", "checksum"])
def test_damaged_result_is_rerun_not_loaded(tiny, tmp_path, toy_experiments, damage):
    first = reproduce(tiny, tmp_path, quick=True, only=["toy_ok"], log=lambda m: None)
    d = tmp_path / "experiments" / "toy_ok"
    target = {
        "table": d / "table.csv",
        "info": d / "info.json",
        "neurons": d / "neurons" / "top.capi",
        "checksum": d / "CHECKSUM",
    }[damage]
    target.write_bytes(target.read_bytes()[:-7])  # truncated
    CALLS.clear()
    logs: list[str] = []
    again = reproduce(tiny, tmp_path, quick=True, only=["toy_ok"], log=logs.append)
    assert CALLS == ["ok"] and any("damaged" in m for m in logs)
    assert again["experiments"]["toy_ok"]["table"] == first["experiments"]["toy_ok"]["table"]
    assert "resumed" not in again["experiments"]["toy_ok"]


def test_mismatched_folder_and_unknown_names(tiny, tmp_path, toy_experiments):
    reproduce(tiny, tmp_path, quick=True, only=["toy_ok"], log=lambda m: None)
    with pytest.raises(ValueError, match="other settings"):
        reproduce(tiny, tmp_path, quick=False, only=["toy_ok"], log=lambda m: None)
    reproduce(tiny, tmp_path, quick=False, only=["toy_ok"], fresh=True, log=lambda m: None)
    with pytest.raises(ValueError, match="unknown experiment"):
        reproduce(tiny, tmp_path, only=["nope"], log=lambda m: None)
    (tmp_path / "run.json").write_text("{not json")  # damaged: results.json's settings stand in
    with pytest.raises(ValueError, match="other settings"):
        reproduce(tiny, tmp_path, quick=True, only=["toy_ok"], log=lambda m: None)
    reproduce(tiny, tmp_path, only=["toy_ok"], log=lambda m: None)  # the same settings: rewritten
    assert json.loads((tmp_path / "run.json").read_text())["quick"] is False


def test_cli(tmp_path, toy_experiments, capsys):
    assert cli(["reproduce", "--list"]) == 0
    assert json.loads(capsys.readouterr().out)["toy_ok"] == "Toy experiment"
    assert cli(["reproduce", "--only", "nope", "--model", "tiny"]) == 2
    assert cli(["reproduce", "--quick", "--only", "toy_ok", "--model", "tiny", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "report.html").exists()
    res = json.loads(capsys.readouterr().out)  # stdout is one JSON document
    assert res["experiments"]["toy_ok"]["status"] == "ran" and res["failed"] == []
    assert res["report"] == str(tmp_path / "report.html")
    argv = ["reproduce", "--quick", "--only", "toy_ok,toy_fail", "--model", "tiny", "--out", str(tmp_path)]
    assert cli(argv) == 1
    res = json.loads(capsys.readouterr().out)
    assert res["experiments"]["toy_ok"]["status"] == "loaded" and res["failed"] == ["toy_fail"]
    assert "boom" in res["experiments"]["toy_fail"]["error"]
    argv = ["reproduce", "--quick", "--only", "toy_ok", "--model", "tiny", "--out", str(tmp_path), "--fresh"]
    assert cli(argv) == 0  # --fresh clears the folder but keeps the lock this run holds
    res = json.loads(capsys.readouterr().out)
    assert res["experiments"]["toy_ok"]["status"] == "ran" and (tmp_path / ".capinterp.lock").exists()


def test_report_can_share_one_plotlyjs(tiny, tmp_path, toy_experiments):
    reproduce(tiny, tmp_path, quick=True, only=["toy_ok"], log=lambda m: None, plotlyjs="directory")
    page = (tmp_path / "report.html").read_text()
    assert 'src="plotly.min.js"' in page and len(page) < 200_000
    assert (tmp_path / "plotly.min.js").stat().st_size > 1_000_000
    reproduce(tiny, tmp_path, quick=True, only=["toy_ok"], log=lambda m: None)  # default: embedded again
    assert (tmp_path / "report.html").stat().st_size > 1_000_000
    with pytest.raises(ValueError, match="plotlyjs"):
        reproduce(tiny, tmp_path, only=["toy_ok"], log=lambda m: None, plotlyjs="cdn")


def test_damaged_cached_scores_are_refitted(tiny, tmp_path, toy_experiments):
    reproduce(tiny, tmp_path, quick=True, only=["toy_ok"], log=lambda m: None)
    cached = tmp_path / "cache" / "scores" / "toy.capi"
    raw = bytearray(cached.read_bytes())
    raw[-3] ^= 0x10
    cached.write_bytes(bytes(raw))
    import shutil

    shutil.rmtree(tmp_path / "experiments" / "toy_ok")
    CALLS.clear()
    reproduce(tiny, tmp_path, quick=True, only=["toy_ok"], log=lambda m: None)
    assert CALLS == ["ok", "fit"]  # the damaged cache was not trusted
    assert NeuronScores.load(cached).shape == (tiny.cfg.n_layers, tiny.cfg.d_mlp)
