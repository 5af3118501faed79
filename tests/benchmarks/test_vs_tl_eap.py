"""``benchmarks/bench_vs_tl_eap.py``: TransformerLens 4's node ``attribution_patch`` and capinterp's
EAP (steps=1), each pair given the other way round, give the same per-writer scores on the tiny
model (agreement only; timing is the benchmark's business)."""

from __future__ import annotations

import os
import sys

import pytest

pytest.importorskip("transformer_lens.tools.analysis.attribution_patching")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))

import bench_vs_tl_eap


def test_eap_writer_scores_agree_with_transformer_lens(tiny):
    agree, t_ours, t_peer = bench_vs_tl_eap.compare(tiny, n=2)
    assert agree["rel"] < 1e-4, agree
    assert agree["spearman"] > 0.999, agree
    assert t_ours > 0 and t_peer > 0


def test_pairs_the_wrong_way_round_disagree(tiny, monkeypatch):
    """The check can fail: capinterp linearized at the other run gives other first-order estimates."""
    real = bench_vs_tl_eap.ours

    def unswapped(model, graph, pairs):
        back = []
        for p in pairs:
            n = len(p.clean.prompt_ids)
            clean = type(p.clean)(list(p.corrupt_ids[:n]), list(p.clean.target_ids), p.clean.example)
            back.append(type(p)(clean, list(p.clean.ids), None, [], "custom"))
        return real(model, graph, back)

    monkeypatch.setattr(bench_vs_tl_eap, "ours", unswapped)
    agree, _, _ = bench_vs_tl_eap.compare(tiny, n=2)
    assert agree["rel"] > 1e-3, agree
