"""Table 4 (method_comparison): IPP helpers on known answers, the planted model's KN row, quick run."""

from __future__ import annotations

import pytest
from planting import plant

import capinterp as ci
from capinterp.circuits.graph import Circuit, Graph
from capinterp.data import Example
from capinterp.experiments import EXPERIMENTS, Context, ExperimentSkipped
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


def test_quick_run_on_tiny_is_skipped_with_the_filter_counts(tiny, tmp_path):
    """The tiny random model knows none of the builtin facts that KN, ROME and KC need: the run says
    so with the counts (it used to return a table whose fact columns were empty)."""
    assert "method_comparison" in EXPERIMENTS
    with pytest.raises(ExperimentSkipped, match=r"known_paraphrases removed every fact: of 3 fact\(s\) \(15 prompts\)"):
        EXPERIMENTS["method_comparison"][1](Context(tiny, quick=True, workdir=tmp_path))
