"""``benchmarks/bench_vs_captum.py``: captum's LayerIntegratedGradients and capinterp's fast IG route
give the same KN scores on the tiny model (agreement only; timing is the benchmark's business).
Skipped where captum (a benchmark-only extra) is not installed."""

from __future__ import annotations

import os
import sys

import pytest

pytest.importorskip("captum.attr")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))

import bench_vs_captum


def test_kn_scores_agree_with_captum(tiny):
    agree, t_ours, t_peer = bench_vs_captum.compare(tiny, n=2, steps=8)
    assert agree["rel"] < 1e-4, agree
    assert agree["spearman"] > 0.999, agree
    assert t_ours > 0 and t_peer > 0


def test_a_different_integral_is_caught(tiny, monkeypatch):
    """The check can fail: captum with another step count gives other scores."""
    real = bench_vs_captum.captum_kn
    monkeypatch.setattr(bench_vs_captum, "captum_kn", lambda m, e, steps, l: real(m, e, 2, l))
    agree, _, _ = bench_vs_captum.compare(tiny, n=1, steps=8)
    assert agree["rel"] > 1e-3, agree
