"""``benchmarks/bench_ig.py --rules --per-layer`` runs end to end and its per-layer table says
what quadrature theory says: on the smooth tiny model, 5 Gauss-Legendre points beat the papers'
20-point right sum at every layer."""

from __future__ import annotations

import os
import re
import subprocess
import sys

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


def test_per_layer_table_orders_the_rules_as_theory_says():
    out = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "benchmarks", "bench_ig.py"),
            "--rules",
            "--quick",
            "--per-layer",
            "--model",
            "tiny",
            "--threads",
            "1",
            "--rule-list",
            "right:20,gauss:5",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    ).stdout
    rows = re.findall(r"^\s+(\d+)\s+([\d.e+-]+) \(\s*(\d+)/50\)\s+([\d.e+-]+) \(\s*(\d+)/50\)$", out, re.M)
    assert [int(r[0]) for r in rows] == [0, 1, 2, 3], out
    for _, right, _, gauss, gauss_top in rows:
        assert float(gauss) < float(right) / 10
        assert int(gauss_top) == 50
