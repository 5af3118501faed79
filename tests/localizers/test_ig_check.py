"""Every IG-based localizer records its per-layer completeness error (issue 30): in ``meta_``
and the results' metadata (JSON, kept by save/load), in ``summary()``; one warning where a
tolerance was asked and missed (the default only reports: tests/kernels/test_completeness_policy.py)."""

from __future__ import annotations

import json
import warnings

import pytest
import torch

import capinterp as ci
from capinterp.core.example import Example
from capinterp.kernels.completeness import CompletenessWarning
from capinterp.units.neurons import NeuronScores

FACT = [Example("1 + 2 =", " 3"), Example("one plus two is", " 3"), Example("2 + 1 =", " 3")]
DATA = [Example("1 + 2 =", " 3"), Example("4 + 4 =", " 8"), Example("5 - 1 =", " 4")]


def _check(meta: dict, n_layers: int) -> dict:
    rep = meta["ig_check"]
    json.dumps(rep)
    assert len(rep["completeness_max"]) == n_layers
    assert all(v is not None and v >= 0 for v in rep["completeness_max"])
    assert rep["aggregate"] == "max and mean over examples"
    return rep


def test_kn_records_per_prompt_completeness_and_warns_once(tiny, tmp_path):
    L = tiny.cfg.n_layers
    with pytest.warns(
        CompletenessWarning, match=r"KN\.fit: .*completeness error above completeness_tol=0\.01 .*worst layer \d"
    ) as rec:
        kn = ci.KN(tiny, steps=2, completeness_tol=0.01, progress=False).fit(FACT)
    assert len([w for w in rec if issubclass(w.category, CompletenessWarning)]) == 1
    rep = _check(kn.meta_, L)
    assert len(rep["completeness"]) == len(FACT) and len(rep["completeness"][0]) == L
    per = torch.tensor(rep["completeness"])
    assert rep["completeness_max"] == pytest.approx(per.max(0).values.tolist())
    assert rep["completeness_mean"] == pytest.approx(per.mean(0).tolist())
    # the results carry it, and it survives save / load
    kn.scores_.save(tmp_path / "s.capi")
    assert NeuronScores.load(tmp_path / "s.capi").meta["ig_check"] == json.loads(json.dumps(rep))
    assert kn.neurons_.meta["ig_check"]["completeness_max"] == rep["completeness_max"]
    df = kn.summary()
    assert list(df.index) == list(range(L))
    assert df["completeness_max"].tolist() == pytest.approx(rep["completeness_max"])
    assert (df["nodes_max"] == 2).all()


def test_kn_fine_rule_is_quiet(tiny):
    with warnings.catch_warnings():
        warnings.simplefilter("error", CompletenessWarning)
        kn = ci.KN(tiny, steps=24, rule="gauss", progress=False).fit(FACT)
    assert max(kn.meta_["ig_check"]["completeness_max"]) < 1e-4


def test_cnl_aggregates_and_adaptive(tiny):
    L = tiny.cfg.n_layers
    coarse = ci.CNL(tiny, steps=2, completeness_tol=10.0, progress=False).fit(DATA)
    rep = _check(coarse.meta_, L)
    assert rep["n_examples"] == len(DATA) and "completeness" not in rep  # dataset-level: aggregates only
    assert coarse.scores_.meta["ig_check"] == rep and coarse.neurons_.meta["ig_check"] == rep
    with warnings.catch_warnings():
        warnings.simplefilter("error", CompletenessWarning)
        ada = ci.CNL(tiny, rule="adaptive", tol=1e-4, progress=False).fit(DATA)
    rep = _check(ada.meta_, L)
    assert max(rep["completeness_max"]) < 1e-4 < max(coarse.meta_["ig_check"]["completeness_max"])
    assert max(rep["error_estimate_max"]) <= 1e-4 and len(set(rep["nodes_max"])) >= 1
    ref = ci.CNL(tiny, steps=64, rule="gauss", progress=False).fit(DATA)
    for l in range(L):
        assert float((ada.scores_[l] - ref.scores_[l]).norm() / ref.scores_[l].norm()) < 1e-4
    assert ada.summary()["error_estimate_max"].max() <= 1e-4


def test_adaptive_cap_warns_through_the_localizer(tiny):
    with pytest.warns(CompletenessWarning, match=r"error estimate above tol \(rule='adaptive'\)=1e-12"):
        ci.CNL(tiny, rule="adaptive", tol=1e-12, max_steps=8, progress=False).fit(DATA[:1])


def test_sig_amig_record_it(tiny):
    L = tiny.cfg.n_layers
    sig = ci.SIG(tiny, steps=16, rule="gauss", progress=False).fit(FACT)
    # SIG's per-position differences F(x) - F(x with a_t = b) are ~1e-5 on the tiny random model
    # (p(target) ~ 1e-3), so float32 gradients leave a relative floor near 1e-4 whatever the nodes
    # (8.4e-5 / 9.0e-5 / 9.6e-5 at 16 / 24 / 32 points; 1.01e-4 once in a full-suite run): the
    # bound sits above that floor and far below a coarse rule's error (right:3: 4.0 on these facts).
    assert max(_check(sig.meta_, L)["completeness_max"]) < 3e-4
    base = torch.full((L, tiny.cfg.d_mlp), 0.05)
    amig = ci.AMIG(tiny, steps=48, rule="gauss", baseline=base, progress=False).fit(FACT)
    assert max(_check(amig.meta_, L)["completeness_max"]) < 1e-4


def test_query_localization_reports_the_worst_layer(tiny):
    with pytest.warns(CompletenessWarning, match="QueryLocalization.fit") as rec:
        ql = ci.QueryLocalization(tiny, localizer="kn", steps=2, completeness_tol=0.01).fit([FACT, FACT[:2]])
    assert len([w for w in rec if issubclass(w.category, CompletenessWarning)]) == 1
    rep = ql.meta_["ig_check"]
    assert rep["n_examples"] == 5
    s = ql.summary()
    assert s["completeness_max"] == pytest.approx(max(rep["completeness_max"]))
    assert rep["completeness_max"][int(s["completeness_worst_layer"])] == s["completeness_max"]


def test_bad_tolerances(tiny):
    with pytest.raises(ValueError, match="completeness_tol"):
        ci.KN(tiny, completeness_tol=0)
    with pytest.raises(ValueError, match="tol"):
        ci.CNL(tiny, rule="adaptive", tol=-1)
    with pytest.raises(ValueError, match="rule"):
        ci.SIG(tiny, rule="adaptive")


def test_cli_localize_prints_completeness(tmp_path, capsys):
    from capinterp.app.cli import main

    assert (
        main(
            ["localize", "--model", "tiny", "--method", "cnl", "--n", "2", "--examples", "all", "--out", str(tmp_path)]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    rec = out["completeness"]  # information: the rule, the worst layer, no tolerance asked
    assert rec["rule"] == "right" and rec["within_tol"] is None and rec["worst_layer_error"] >= 0
