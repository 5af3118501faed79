"""Chance levels of set metrics: exact against enumeration of every pair of subsets."""

from __future__ import annotations

import itertools
from fractions import Fraction

import numpy as np
import pytest
import torch

import capinterp as ci
from capinterp.units import metrics as M
from capinterp.units.base import KeySet
from capinterp.units.chance import hypergeom_pmf
from capinterp.units.neurons import NeuronSet


def _frac(k: int, d: int) -> Fraction:
    return Fraction(k, d) if d else Fraction(0)  # one empty set scores 0 (metrics' convention)


EXACT = {
    "overlap": lambda k, a, b: _frac(k, min(a, b)),
    "iou": lambda k, a, b: _frac(k, a + b - k),
    "cohesion": lambda k, a, b: _frac(k, max(a, b)),
    "separability": lambda k, a, b: _frac(k, max(a, b)),
}


def _enumerate(n: int, a: int, b: int, observed: int) -> tuple[dict[str, Fraction], Fraction]:
    """Mean of every metric and P(|A ∩ B| >= observed) over all pairs of subsets, as fractions."""
    sums = dict.fromkeys(EXACT, Fraction(0))
    tail, count = 0, 0
    for sa in itertools.combinations(range(n), a):
        for sb in itertools.combinations(range(n), b):
            k = len(set(sa) & set(sb))
            for name, f in EXACT.items():
                sums[name] += f(k, a, b)
            tail += k >= observed
            count += 1
    return {name: s / count for name, s in sums.items()}, Fraction(tail, count)


@pytest.mark.parametrize(("n", "a", "b"), [(7, 3, 4), (6, 2, 2), (8, 5, 6), (5, 1, 4), (6, 0, 3)])
@pytest.mark.parametrize("metric", sorted(EXACT))
def test_chance_equals_enumeration_of_all_pairs(n, a, b, metric):
    A = set(range(a))
    B = set(range(a - min(a, 1), a - min(a, 1) + b))  # shares one unit when a > 0
    means, tail = _enumerate(n, a, b, len(A & B))
    c = M.chance(A, B, metric, n_units=n)
    assert c.expected == pytest.approx(float(means[metric]), abs=1e-12)
    assert c.p_value == pytest.approx(float(tail), abs=1e-12)
    assert c.observed == pytest.approx(getattr(M, metric)(A, B))
    assert c.expected_intersection == pytest.approx(a * b / n)


def test_overlap_chance_has_the_closed_form_on_a_large_universe():
    # 13 neurons of 46,080 against 200: E[overlap] = a b / (N min(a, b)) = 200 / 46080
    pmf_k, pmf = hypergeom_pmf(46080, 13, 200)
    assert pmf.sum() == pytest.approx(1.0) and pmf_k[0] == 0
    c = M.chance(set(range(13)), set(range(200)), "overlap", n_units=46080)
    assert c.expected == pytest.approx(200 / 46080, rel=1e-12)
    assert c.observed == 1.0 and c.p_value < 1e-30  # 13 of 13 shared: far beyond chance


def test_chance_reads_the_universe_from_unit_sets():
    m1, m2 = torch.zeros(3, 8, dtype=torch.bool), torch.zeros(3, 8, dtype=torch.bool)
    m1[0, :4] = True
    m2[0, 2:6] = True
    a, b = NeuronSet(m1), NeuronSet(m2)
    c = ci.metrics.chance(a, b, "iou")
    assert c.n_units == 24 and c.intersection == 2 and c.sizes == (4, 4)
    assert c.expected == pytest.approx(M.chance(set(range(4)), {0, 1, 2, 3}, "iou", n_units=24).expected)
    layers = ci.metrics.chance(KeySet.layers([1, 2], 5), KeySet.layers([2, 3], 5), "overlap")
    assert layers.n_units == 5 and layers.expected == pytest.approx(2 * 2 / 5 / 2)


def test_chance_refuses_what_it_cannot_compute():
    with pytest.raises(ValueError, match="n_units"):
        M.chance({1, 2}, {2, 3})
    with pytest.raises(ValueError, match="metric"):
        M.chance({1}, {1}, "dice", n_units=4)
    with pytest.raises(ValueError, match="more units"):
        M.chance(set(range(5)), {1}, n_units=4)
    assert M.chance(set(), set(), "iou", n_units=4).expected == 1.0  # two empty sets: 1 by convention


def test_monte_carlo_agrees_on_a_mid_size_universe():
    rng = np.random.default_rng(0)
    n, a, b = 60, 12, 20
    draws = [len(set(rng.choice(n, a, replace=False)) & set(rng.choice(n, b, replace=False))) for _ in range(20000)]
    iou = np.mean([k / (a + b - k) for k in draws])
    assert M.chance(set(range(a)), set(range(b)), "iou", n_units=n).expected == pytest.approx(iou, rel=0.02)


def test_bootstrap_ci_covers_the_mean_and_narrows_with_data():
    rng = np.random.default_rng(1)
    small, large = rng.normal(0.5, 0.1, 10), rng.normal(0.5, 0.1, 1000)
    lo_s, hi_s = M.bootstrap_ci(small, n_boot=500)
    lo_l, hi_l = M.bootstrap_ci(large, n_boot=500)
    assert lo_s < small.mean() < hi_s and lo_l < 0.5 < hi_l
    assert hi_l - lo_l < (hi_s - lo_s) / 3
    assert np.isnan(M.bootstrap_ci([0.3])[0])
    with pytest.raises(ValueError, match="level"):
        M.bootstrap_ci(small, level=1.5)


def test_chance_stats_are_the_columns_experiments_report():
    a, b = set(range(10)), set(range(5, 30))
    row = M.chance_stats(a, b, ("overlap", "iou", "cohesion"), n_units=100)
    assert set(row) == {"overlap_chance", "iou_chance", "cohesion_chance", "p_value"}
    for name in ("overlap", "iou", "cohesion"):
        assert row[f"{name}_chance"] == M.chance(a, b, name, n_units=100).expected
    assert row["p_value"] == M.chance(a, b, n_units=100).p_value
