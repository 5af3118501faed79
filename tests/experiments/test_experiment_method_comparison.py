"""Table 4 (method_comparison): IPP helpers on known answers, the planted model's KN row, quick run."""

from __future__ import annotations

import math

import pytest
from planting import plant

import capinterp as ci
from capinterp.circuits.graph import Circuit, Graph
from capinterp.data import Example
from capinterp.experiments import EXPERIMENTS, Context
from capinterp.experiments import method_comparison as MC

SEVENS = [Example(f"{a}+{b}=", "7", {"subject": f"{a}+{b}"}) for a, b in [(3, 4), (5, 2), (1, 6), (2, 5)]]


@pytest.fixture(scope="module")
def planted():
    m = ci.load_model("tiny")
    plant(m, SEVENS)
    return m


def test_ipp_is_zero_when_the_random_draws_equal_the_located_units(tiny):
    ex = Example("3+4=", "7")
    all_layers = list(range(tiny.cfg.n_layers))
    assert MC.rome_ipp(tiny, ex, all_layers, n_random=2) == 0.0  # every draw is every layer
    graph = Graph.from_model(tiny)
    assert MC.kc_ipp(tiny, Circuit.full(graph), [ex], n_random=2) == 0.0  # every draw is every edge
    assert MC.kc_ipp(tiny, Circuit.empty(graph), [ex], n_random=2) == 0.0  # nothing removed either way


def test_planted_knowledge_neurons_beat_random_ones(planted):
    rows = {
        r["method"]: r
        for r in MC._fact_rows(
            planted,
            [SEVENS[:3]],
            kn_steps=4,
            kn_rule="right",
            ct_samples=1,
            kc_top_n=30,
            n_random=3,
            seed=0,
            cache=None,
        )
    }
    assert set(rows) == {"KN", "ROME", "KC"}
    assert rows["KN"]["ipp"] > 0  # erasing the planted neurons drops p("7") more than any random set
    assert 0 < rows["KN"]["neuron_pct"] < 5 and 0 <= rows["KN"]["overlap"] <= 100


def test_quick_run_on_tiny(tiny, tmp_path):
    assert "method_comparison" in EXPERIMENTS
    res = EXPERIMENTS["method_comparison"][1](Context(tiny, quick=True, workdir=tmp_path))
    assert list(res.table.columns) == MC.COLUMNS and list(res.table["method"]) == list(MC.METHODS)
    assert list(res.table["paper_ipp"]) == [11.4, 0.0, 10.5, 20.0]
    for _, row in res.table.iterrows():
        assert math.isnan(row["overlap"]) or 0 <= row["overlap"] <= 100
        assert math.isnan(row["neuron_pct"]) or 0 <= row["neuron_pct"] <= 100
        assert math.isnan(row["ipp"]) or -100 <= row["ipp"] <= 100
    res.save(tmp_path / "out")
