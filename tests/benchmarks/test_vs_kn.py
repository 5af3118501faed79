"""``benchmarks/bench_vs_kn.py``: EleutherAI's knowledge-neurons (pointed at the post-activation
neurons) and capinterp's fast IG route give the same KN scores on the tiny model (agreement only).
Skipped where knowledge-neurons (a benchmark-only extra) is not installed."""

from __future__ import annotations

import os
import sys

import pytest

pytest.importorskip("knowledge_neurons")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))

import bench_vs_kn


def test_kn_scores_agree_with_knowledge_neurons(tiny):
    agree, t_ours, t_peer = bench_vs_kn.compare(tiny, n=2, steps=8)
    assert agree["rel"] < 1e-4, agree
    assert agree["spearman"] > 0.999, agree
    assert t_ours > 0 and t_peer > 0
    # the inserted identity modules are gone again: the model's own MLPs are untouched
    assert not any(type(m).__name__ == "_Neurons" for m in tiny.original_model.modules())


def test_pre_activation_scores_differ(tiny, monkeypatch):
    """The check can fail: the package with another step count gives other scores."""
    real = bench_vs_kn.kn_scores
    monkeypatch.setattr(bench_vs_kn, "kn_scores", lambda m, e, steps, ls: real(m, e, 2, ls))
    agree, _, _ = bench_vs_kn.compare(tiny, n=1, steps=8)
    assert agree["rel"] > 1e-3, agree
