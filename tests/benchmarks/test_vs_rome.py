"""``benchmarks/bench_vs_rome.py``: ROME's own ``calculate_hidden_flow`` and capinterp's causal tracing give
the same grids on the tiny model (agreement only). ROME is not on PyPI and never shipped: the comparison
runs where its repository is checked out beside the project (``../peers/rome``, or ``CAPINTERP_ROME_DIR``),
and is skipped otherwise; without it the benchmark itself says how to fetch it and exits 0."""

from __future__ import annotations

import os
import sys
import types
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))

import bench_vs_rome

ROME_DIR = os.environ.get("CAPINTERP_ROME_DIR") or str(Path(__file__).resolve().parents[3] / "peers" / "rome")
HAVE_ROME = os.path.isfile(os.path.join(ROME_DIR, "experiments", "causal_trace.py"))
needs_rome = pytest.mark.skipif(not HAVE_ROME, reason=f"ROME's repository is not at {ROME_DIR}")


def test_without_rome_the_benchmark_says_how_to_fetch_it(tmp_path, capsys):
    assert bench_vs_rome.main(["--rome-dir", str(tmp_path)]) == 0  # no model is loaded
    out = capsys.readouterr().out
    assert out.startswith("skipped:") and "github.com/kmeng01/rome" in out
    with pytest.raises(FileNotFoundError, match="kmeng01/rome"):
        bench_vs_rome.load_rome(str(tmp_path))


def test_bad_arguments_are_refused():
    with pytest.raises(SystemExit):
        bench_vs_rome.main(["--samples", "0"])


@pytest.fixture(scope="module")
def rome():
    if not HAVE_ROME:
        pytest.skip(f"ROME's repository is not at {ROME_DIR}")
    return bench_vs_rome.load_rome(ROME_DIR)


@needs_rome
def test_grids_agree_with_rome(tiny, rome):
    facts = bench_vs_rome.facts_for(tiny, "tiny", 1)
    agree, t_ours, t_rome, tr = bench_vs_rome.compare(rome, tiny, facts, ["resid", "mlp", "attn"], 3, 3)
    assert agree["max_effect"] > 1e-3, agree  # the grids hold effects to compare
    assert agree["rel"] < 1e-5, agree
    assert agree["p_corrupt_diff"] < 1e-6, agree
    assert t_ours["wall"] > 0 and t_rome["cpu"] > 0
    assert "rome" not in sys.modules and "dsets" not in sys.modules  # ROME's stubs are gone again


@needs_rome
def test_other_noise_is_caught(tiny, rome, monkeypatch):
    """The check can fail: ROME's noise drawn from another seed gives other grids."""
    facts = bench_vs_rome.facts_for(tiny, "tiny", 1)
    other = types.SimpleNamespace(
        random=types.SimpleNamespace(RandomState=lambda seed: np.random.RandomState(seed + 1))
    )
    monkeypatch.setattr(rome, "numpy", other)  # ROME's module only; capinterp keeps seed 1
    agree, _, _, _ = bench_vs_rome.compare(rome, tiny, facts, ["mlp"], 3, 3)
    assert agree["rel"] > 1e-3, agree
