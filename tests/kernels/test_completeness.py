"""Completeness per layer and the adaptive rule of the IG kernel (issue 30).

F(x) and F(baseline) are recomputed here with plain full forwards (tests/ig_reference.py), not
with the kernel's extra rows, so the recorded completeness error is checked independently.
"""

from __future__ import annotations

import itertools
import json
import warnings

import pytest
import torch
from ig_reference import ref_objective

from capinterp.core.example import Example
from capinterp.core.tokens import encode
from capinterp.kernels.completeness import (
    CompletenessLog,
    CompletenessWarning,
    completeness_error,
    completeness_error_l1,
    merge_reports,
)
from capinterp.kernels.ig import ig_scores
from capinterp.kernels.ig_config import IGConfig
from capinterp.kernels.sequential import DEFAULT, sig_scores

EXAMPLES = [Example("1 + 2 =", " 3 4"), Example("a b c d", " e"), Example("7 - 5 = 2 ;", " 9 1 0")]


@pytest.fixture(scope="module")
def encs(tiny):
    return encode(tiny, EXAMPLES)


def _independent(model, enc, positions, layer, baseline):
    """(F(x), F(baseline at ``layer``)) from plain forwards."""
    n_pos = len(enc.target_ids) if positions == "answer" else 1
    d_mlp = model.cfg.d_mlp
    value = torch.zeros(n_pos, d_mlp) if baseline is None else baseline[layer].expand(n_pos, d_mlp)
    with torch.no_grad():
        fx = float(ref_objective(model, enc, positions=positions))
        fb = float(ref_objective(model, enc, positions=positions, layer=layer, value=value))
    return fx, fb


@pytest.mark.parametrize("method", ["fast", "prefix", "loop"])
@pytest.mark.parametrize("positions", ["answer", "last_prompt"])
def test_fine_gauss_rule_is_complete(tiny, encs, method, positions):
    stats: dict = {}
    scores = ig_scores(tiny, encs, IGConfig(steps=32, rule="gauss", positions=positions, route=method), stats=stats)
    L = tiny.cfg.n_layers
    assert stats["completeness"].shape == (len(encs), L)
    assert float(stats["completeness"].max()) < 1e-4  # Gauss-Legendre 32 on a smooth path: exact to float32
    # the recorded sums are the returned scores' sums, F(x) the reference's
    assert torch.allclose(stats["attr_sum"], scores.double().sum(-1), rtol=1e-5, atol=1e-8)
    for i, enc in enumerate(encs):
        fx, fb = _independent(tiny, enc, positions, 0, None)
        assert stats["f_clean"][i] == pytest.approx(fx, rel=1e-5, abs=1e-7)
        assert stats["f_base"][i, 0] == pytest.approx(fb, rel=1e-5, abs=1e-7)
    assert torch.isnan(stats["error_estimate"]).all()  # a fixed rule has no estimate
    assert bool((stats["nodes"] == 32).all())


@pytest.mark.parametrize("with_baseline", [False, True])
def test_coarse_right_rule_error_equals_independent_value(tiny, encs, with_baseline):
    L, d = tiny.cfg.n_layers, tiny.cfg.d_mlp
    g = torch.Generator().manual_seed(1)
    baseline = 0.3 * torch.randn(L, d, generator=g).abs() if with_baseline else None
    stats: dict = {}
    scores = ig_scores(tiny, encs, IGConfig(steps=3, rule="right"), baseline=baseline, stats=stats)
    comp = stats["completeness"]
    assert float(comp.max()) > 1e-3  # three right Riemann points are far from the integral
    for i, enc in enumerate(encs):
        for l in range(L):
            fx, fb = _independent(tiny, enc, "answer", l, baseline)
            expect = abs(float(scores[i, l].double().sum()) - (fx - fb)) / abs(fx - fb)
            assert float(comp[i, l]) == pytest.approx(expect, rel=1e-3, abs=1e-6), (i, l)
    # and the fine rule's error is far below the coarse one's on the same examples
    fine: dict = {}
    ig_scores(tiny, encs, IGConfig(steps=32, rule="gauss"), baseline=baseline, stats=fine)
    assert float(fine["completeness"].max()) < 1e-4 < float(comp.max())


def test_l1_normalized_completeness_is_recorded_and_reported(tiny, encs):
    """``attr_l1`` is the scores' L1 norm; the report's ``completeness_l1_max`` is the violation
    over max(|F(x) - F(b)|, ||IG||_1), here from plain forwards and the returned scores."""
    L = tiny.cfg.n_layers
    stats: dict = {}
    scores = ig_scores(tiny, encs, IGConfig(steps=3, rule="right"), stats=stats)
    assert torch.allclose(stats["attr_l1"], scores.double().abs().sum(-1), rtol=1e-5)
    log = CompletenessLog(L)
    log.add(stats)
    rep = log.report()
    expect = torch.zeros(len(encs), L, dtype=torch.float64)
    for i, enc in enumerate(encs):
        for l in range(L):
            fx, fb = _independent(tiny, enc, "answer", l, None)
            s = scores[i, l].double()
            expect[i, l] = abs(float(s.sum()) - (fx - fb)) / max(abs(fx - fb), float(s.abs().sum()))
    assert rep["completeness_l1_max"] == pytest.approx(expect.max(0).values.tolist(), rel=1e-3, abs=1e-7)
    # never above the |F(x) - F(b)|-normalized error, and strictly below where the scores cancel
    assert all(a <= b * (1 + 1e-9) for a, b in zip(rep["completeness_l1_max"], rep["completeness_max"]))
    merged = merge_reports([rep, rep])
    assert merged["completeness_l1_max"] == rep["completeness_l1_max"]


def test_completeness_error_l1_definition():
    assert completeness_error_l1(0.5, 2.0, 1.0, 0.25) == pytest.approx(0.25 / 2.0)  # ||IG||_1 dominates
    assert completeness_error_l1(0.5, 0.6, 1.0, 0.25) == pytest.approx(0.25 / 0.75)  # the change dominates
    assert completeness_error_l1(0.75, 1.0, 1.0, 0.25) == 0.0


def test_completeness_error_definition():
    assert completeness_error(0.5, 1.0, 0.25) == pytest.approx(abs(0.5 - 0.75) / 0.75)
    assert completeness_error(0.0, 1.0, 1.0) == 0.0
    assert completeness_error(0.1, 1.0, 1.0) == float("inf")


def test_sig_completeness_sums_over_positions(tiny):
    enc = encode(tiny, [Example("1 + 2 = 5", " 3")], max_target_tokens=1)[0]
    for method in ("fast", "loop"):
        coarse: dict = {}
        fine: dict = {}
        pos = list(range(1, enc.last_prompt_pos + 1))
        sig_scores(tiny, enc, DEFAULT.replace(steps=3, rule="right", route=method), at=pos, stats=coarse)
        out = sig_scores(tiny, enc, DEFAULT.replace(steps=24, rule="gauss", route=method), at=pos, stats=fine)
        assert float(fine["completeness"].max()) < 1e-4 < float(coarse["completeness"].max())
        assert torch.allclose(fine["attr_l1"][0], out.double().abs().sum(-1), rtol=1e-5)
    # the effective baseline value: F(x) - sum_t (F(x) - F(x with a_t = 0)), from plain forwards
    last, layer = enc.last_prompt_pos, 1
    with torch.no_grad():
        fx = float(ref_objective(tiny, enc, positions="last_prompt"))
    change = 0.0
    for t in range(1, last + 1):
        tokens = torch.tensor([enc.ids], device=tiny.cfg.device)

        def zero(act, hook, t=t):
            act = act.clone()
            act[0, t] = 0
            return act

        with torch.no_grad():
            logits = tiny.run_with_hooks(tokens, fwd_hooks=[(f"blocks.{layer}.mlp.hook_post", zero)])[0]
        change += fx - float(torch.softmax(logits[last].double(), -1)[enc.target_ids[0]])
    assert float(fine["f_base"][0, layer]) == pytest.approx(fx - change, rel=1e-4, abs=1e-6)


def test_adaptive_agrees_with_gauss_64_on_every_layer(tiny, encs):
    tol = 1e-4
    stats: dict = {}
    ada = ig_scores(tiny, encs, IGConfig(rule="adaptive", tol=tol), stats=stats)
    ref = ig_scores(tiny, encs, IGConfig(steps=64, rule="gauss"))
    for i in range(len(encs)):
        for l in range(tiny.cfg.n_layers):
            err = float((ada[i, l] - ref[i, l]).norm() / ref[i, l].norm())
            assert err < tol, (i, l, err)
    assert bool((stats["error_estimate"] <= tol).all())
    assert float(stats["completeness"].max()) < 1e-4
    # layers with a smoother integrand stop earlier: the node counts differ across layers
    assert len(set(stats["nodes"].flatten().tolist())) > 1
    # fewer rows than GL-64 on every layer
    assert stats["rows"] < len(encs) * tiny.cfg.n_layers * 64


def test_adaptive_runs_one_kernel_call_per_round(tiny, encs, monkeypatch):
    import capinterp.kernels.ig as ig

    calls = []
    real = ig._ig_rows

    def spy(model, s, lay, *args, **kwargs):
        calls.append(list(lay))
        return real(model, s, lay, *args, **kwargs)

    monkeypatch.setattr(ig, "_ig_rows", spy)
    stats: dict = {}
    ig.ig_scores(tiny, encs[:1], IGConfig(rule="adaptive", tol=1e-4), stats=stats)
    # every round is one call, with only the layers not yet converged (a shrinking subset)
    assert calls[0] == list(range(tiny.cfg.n_layers))
    assert all(set(b) <= set(a) for a, b in itertools.pairwise(calls))
    assert len(calls) == int(stats["nodes"].max()).bit_length() - 2  # 4, 8, ..., max: one call each


def test_adaptive_warns_at_the_cap(tiny, encs):
    with pytest.warns(CompletenessWarning, match=r"max_steps=8 .*layer \d"):
        stats: dict = {}
        ig_scores(tiny, encs[:1], IGConfig(rule="adaptive", tol=1e-12, max_steps=8), stats=stats)
    assert bool((stats["nodes"] == 8).all())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ig_scores(tiny, encs[:1], IGConfig(rule="adaptive", tol=1e-3))


def test_adaptive_rejects_bad_tolerances(tiny, encs):
    with pytest.raises(ValueError, match="tol"):
        ig_scores(tiny, encs[:1], IGConfig(rule="adaptive", tol=0.0))
    with pytest.raises(ValueError, match="max_steps"):
        ig_scores(tiny, encs[:1], IGConfig(rule="adaptive", max_steps=0))
    with pytest.raises(ValueError, match="rule"):
        sig_scores(tiny, encs[0], DEFAULT.replace(rule="adaptive"))


def test_stats_are_json_ready(tiny, encs):
    stats: dict = {}
    ig_scores(tiny, encs[:1], IGConfig(steps=4, rule="gauss"), stats=stats)
    json.dumps({k: v.tolist() if isinstance(v, torch.Tensor) else v for k, v in stats.items()})
