"""The IG completeness policy: the default (the papers' right:20 rule) is reported as the papers'
approximation, never warned about; a warning only where an accuracy was asked and missed; the
same report after a resume from a checkpoint, records included (issue 46 finding 3, issue 51 item 4).
"""

from __future__ import annotations

import json
import math
import warnings

import pytest
import torch

import capinterp as ci
from capinterp.core.example import Example
from capinterp.kernels.accumulate import ScoreSum
from capinterp.kernels.completeness import CompletenessWarning, merge_reports, warn_report
from capinterp.kernels.ig_config import IGConfig
from capinterp.localizers.ig_check import ig_check_line

DATA = [Example("1 + 2 =", " 3"), Example("4 + 4 =", " 8"), Example("5 - 1 =", " 4"), Example("2 + 2 =", " 4")]
FACT = [Example("1 + 2 =", " 3"), Example("one plus two is", " 3"), Example("2 + 1 =", " 3")]


@pytest.mark.parametrize("make", [lambda m: ci.CNL(m, progress=False), lambda m: ci.KN(m, progress=False)])
def test_default_fit_reports_and_does_not_warn(tiny, make):
    loc = make(tiny)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CompletenessWarning)
        loc.fit(DATA if isinstance(loc, ci.CNL) else FACT)
    rep = loc.meta_["ig_check"]
    assert (rep["rule"], rep["steps"], rep["completeness_tol"]) == ("right", 20, None)
    assert "papers' fixed rule right:20" in rep["approximation"] and rep["within_tol"] is None
    # the papers' rule is off on this model: the report says by how much (information, not an alarm)
    assert max(rep["completeness_max"]) > 0.05
    assert loc.scores_.meta["ig_check"] == rep
    df = loc.summary()
    assert df.columns.name == "IG rule right:20 (the papers' approximation)" and "within_tol" not in df
    assert df.attrs["ig_check"]["approximation"] == rep["approximation"]
    line = ig_check_line(rep)
    assert line.startswith("IG rule right:20 (the papers' approximation): completeness error max ")
    assert line.endswith("no tolerance asked")
    # the results say so in their repr too (NeuronScores, NeuronSet)
    assert repr(loc.scores_).endswith(f"; {line})") and repr(loc.neurons_).endswith(f"; {line})")


def test_explicit_tolerance_warns_only_when_missed(tiny):
    with pytest.warns(CompletenessWarning, match=r"CNL\.fit: IG completeness error above completeness_tol=1e-09"):
        strict = ci.CNL(tiny, completeness_tol=1e-9, progress=False).fit(DATA[:2])
    rep = strict.meta_["ig_check"]
    assert rep["within_tol"] is False and rep["completeness_tol"] == 1e-9
    assert sorted(rep["over_tol"]["completeness_tol"]) == list(range(tiny.cfg.n_layers))
    assert not strict.summary()["within_tol"].any()
    assert ig_check_line(rep).endswith("OVER the tolerance asked")
    with warnings.catch_warnings():
        warnings.simplefilter("error", CompletenessWarning)
        loose = ci.CNL(tiny, completeness_tol=10.0, progress=False).fit(DATA[:2])
    assert loose.meta_["ig_check"]["within_tol"] is True and loose.summary()["within_tol"].all()


def test_adaptive_tolerance_missed_at_the_cap_warns(tiny):
    with pytest.warns(CompletenessWarning, match=r"error estimate above tol \(rule='adaptive'\)=1e-12.*max_steps"):
        loc = ci.CNL(tiny, rule="adaptive", tol=1e-12, max_steps=8, progress=False).fit(DATA[:1])
    rep = loc.meta_["ig_check"]
    assert rep["adaptive_tol"] == 1e-12 and rep["steps"] is None and rep["within_tol"] is False
    assert rep["approximation"].startswith("adaptive rule")


@pytest.mark.parametrize("bad", [0, -1.0, math.nan, math.inf, True, "0.1"])
def test_completeness_tol_is_validated(tiny, bad):
    with pytest.raises(ValueError, match=r"completeness_tol must be a finite number > 0, or None"):
        ci.CNL(tiny, completeness_tol=bad)
    with pytest.raises(ValueError, match="completeness_tol"):
        IGConfig(completeness_tol=bad)
    assert IGConfig().completeness_tol is None and IGConfig(completeness_tol=0.05).completeness_tol == 0.05


def test_merged_reports_are_judged_again():
    rep = {"n_examples": 2, "rule": "right", "steps": 20, "completeness_tol": 0.1, "adaptive_tol": None}
    a = {**rep, "completeness_max": [0.05, 0.2], "completeness_mean": [0.05, 0.1], "nodes_mean": [20, 20]}
    b = {**rep, "completeness_max": [0.01, 0.02], "completeness_mean": [0.01, 0.01], "nodes_mean": [20, 20]}
    merged = merge_reports([a, b])
    assert merged["within_tol"] is False and merged["over_tol"] == {"completeness_tol": [1]}
    assert merged["completeness_mean"] == pytest.approx([0.03, 0.055])
    with pytest.warns(CompletenessWarning, match="layer 1: 0.2"):
        assert warn_report(merged, "x")
    with warnings.catch_warnings():
        warnings.simplefilter("error", CompletenessWarning)
        assert not warn_report({**merged, "completeness_tol": None}, "x")  # nothing asked: no warning


def test_resumed_fit_has_the_uninterrupted_report(tiny, tmp_path, monkeypatch):
    full = ci.CNL(tiny, steps=4, progress=False).fit(DATA)
    ck = tmp_path / "cnl.ckpt"
    loc = ci.CNL(tiny, steps=4, progress=False, checkpoint=ck)
    real, calls = loc._score_chunk, []

    def dying(items):
        if calls:
            raise KeyboardInterrupt  # killed after the first chunk was scored and checkpointed
        calls.append(1)
        return real(items)

    monkeypatch.setattr(loc, "_score_chunk", dying)
    with pytest.raises(KeyboardInterrupt):
        loc.fit(DATA)
    monkeypatch.undo()
    assert ScoreSum.load(ck).count == 1
    resumed = ci.CNL(tiny, steps=4, progress=False, checkpoint=ck).fit(DATA)
    assert resumed.meta_["ig_check"] == full.meta_["ig_check"]  # exactly, every field
    assert resumed.meta_["ig_check"]["n_examples"] == len(DATA)
    # a fully resumed fit (nothing left to score) keeps the report too, and it survives save / load
    again = ci.CNL(tiny, steps=4, progress=False, checkpoint=ck)
    again._score_chunk = lambda items: pytest.fail("a resumed fit scored an example again")
    again.fit(DATA)
    assert again.meta_["ig_check"] == full.meta_["ig_check"]
    again.scores_.save(tmp_path / "s.capi")
    loaded = ci.NeuronScores.load(tmp_path / "s.capi").meta["ig_check"]
    assert loaded == json.loads(json.dumps(full.meta_["ig_check"]))


def test_asking_for_a_tolerance_afterwards_resumes_and_judges_the_records(tiny, tmp_path):
    ck = tmp_path / "cnl-{key}.ckpt"
    first = ci.CNL(tiny, steps=4, progress=False, checkpoint=ck).fit(DATA[:2])
    strict = ci.CNL(tiny, steps=4, completeness_tol=1e-9, progress=False, checkpoint=ck)
    strict._score_chunk = lambda items: pytest.fail("asking for a tolerance scored an example again")
    with pytest.warns(CompletenessWarning, match="completeness_tol=1e-09"):
        strict.fit(DATA[:2])
    assert strict.checkpoint_path_ == first.checkpoint_path_
    a, b = first.meta_["ig_check"], strict.meta_["ig_check"]
    assert a["completeness_max"] == b["completeness_max"] and (a["within_tol"], b["within_tol"]) == (None, False)


def test_checkpoint_records_must_match_its_sums(tiny, tmp_path):
    ck = tmp_path / "cnl.ckpt"
    ci.CNL(tiny, steps=4, progress=False, checkpoint=ck).fit(DATA[:2])
    acc = ScoreSum.load(ck)
    acc.extra["records.index"] = torch.tensor([0, 0])
    acc.save(ck)
    with pytest.raises(ValueError, match="per-example records cover other examples"):
        ci.CNL(tiny, steps=4, progress=False, checkpoint=ck).fit(DATA[:2])
