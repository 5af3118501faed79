"""Necessity beside sufficiency, bootstrap intervals and the shared random band of faithfulness:
removing planted neurons loses the behaviour (a large ablated area), removing random ones does
not; intervals hold the point estimate and narrow with more examples; a band is reused, not rerun."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch
from planting import PLANTED, SEVENS, plant, planted_scores

import capinterp as ci
from capinterp.arch.model import neuron_shape
from capinterp.data import Example
from capinterp.interventions.faithfulness import faithfulness
from capinterp.interventions.faithfulness_stats import areas, bootstrap_areas, curve_grid

F = sys.modules["capinterp.interventions.faithfulness"]

EXAMPLES = [Example(f"{a}+{b}=", "7") for a, b in SEVENS]


@pytest.fixture(scope="module")
def planted():
    m = ci.load_model("tiny")
    plant(m, EXAMPLES)
    return m


def test_removing_planted_neurons_gives_a_large_ablated_area(planted):
    res = faithfulness(planted, planted_scores(planted), EXAMPLES, ks=[3, 12], ablation="zero", random_sets=10)
    # the three planted neurons carry the behaviour: removing them loses most of it at every size
    assert res.ablated_area > 0.8 and res.random_ablated_area[2] < 0.7
    assert res.ablated_area > res.random_ablated_area[2] + 0.2
    # the area is the trapezoid of 1 - g over the measured sizes, g = 1 at k = 0 and 0 with all ablated
    x = np.array([0.0, *res.table["fraction"], 1.0])
    lost = np.array([0.0, *(1 - res.table["ablated_faithfulness"]), 1.0])
    assert res.ablated_area == pytest.approx(np.trapezoid(lost, x))
    assert "random_ablated_faithfulness_p95" in res.table and "ablated area" in res.summary()
    assert res.to_dict()["ablated_area"] == res.ablated_area


def test_random_units_are_not_necessary(planted):
    noise = ci.NeuronScores(torch.rand(neuron_shape(planted), generator=torch.Generator().manual_seed(3)))
    noise.scores[[l for l, _ in PLANTED], [i for _, i in PLANTED]] = -1.0  # never picks a planted neuron
    res = faithfulness(planted, noise, EXAMPLES, ks=[3, 12], ablation="zero", random_sets=4)
    assert res.ablated_area < 0.7


def test_intervals_hold_the_estimate_and_narrow_with_more_examples(planted):
    scores = planted_scores(planted)
    few = faithfulness(planted, scores, EXAMPLES, ks=[3, 40], ablation="zero", random_sets=0, bootstrap=400)
    many = faithfulness(planted, scores, EXAMPLES * 6, ks=[3, 40], ablation="zero", random_sets=0, bootstrap=400)
    for name in ("cpr", "cmd", "ablated_area"):
        for res in (few, many):
            lo, hi = getattr(res, f"{name}_ci")
            assert lo <= getattr(res, name) <= hi
        assert getattr(many, name) == pytest.approx(getattr(few, name))
        width = lambda r: np.diff(getattr(r, f"{name}_ci"))[0]  # noqa: E731
        assert width(many) < 0.7 * width(few)
    none = faithfulness(planted, scores, EXAMPLES, ks=[3], ablation="zero", random_sets=0, bootstrap=0)
    assert np.isnan(none.cpr_ci).all() and np.isfinite(none.cpr)


def test_bootstrap_resamples_examples_not_configurations():
    rng = np.random.default_rng(0)
    grid = curve_grid(np.array([0.1, 0.5]))

    def values(n: int) -> np.ndarray:  # full, empty, (kept, ablated) x 2 sizes, per example
        base = np.array([1.0, 0.0, 0.3, 0.6, 0.8, 0.1])[:, None]
        return base + 0.2 * rng.standard_normal((6, n))

    small, large = values(20), values(500)
    ci_small = bootstrap_areas(grid, small, resamples=500, seed=0)
    ci_large = bootstrap_areas(grid, large, resamples=500, seed=0)
    point = areas(grid, large.mean(1)[0], large.mean(1)[1], large.mean(1)[2::2], large.mean(1)[3::2])
    assert np.all(ci_large[:, 0] <= point) and np.all(point <= ci_large[:, 1])
    assert np.all(np.diff(ci_large, axis=1) < 0.5 * np.diff(ci_small, axis=1))
    assert np.array_equal(ci_small, bootstrap_areas(grid, small, resamples=500, seed=0))  # seeded


def test_a_band_is_reused_not_rerun(planted, monkeypatch):
    calls = []
    masks = F._unit_masks
    monkeypatch.setattr(F, "_unit_masks", lambda *a, **k: calls.append(a[2:]) or masks(*a, **k))
    first = faithfulness(planted, planted_scores(planted), EXAMPLES, ks=[3, 12], ablation="zero", random_sets=3)
    other = ci.NeuronScores(torch.rand(neuron_shape(planted), generator=torch.Generator().manual_seed(1)))
    again = faithfulness(planted, other, EXAMPLES, ks=[3, 12], ablation="zero", random_sets=3, band=first.band)
    fresh = faithfulness(planted, other, EXAMPLES, ks=[3, 12], ablation="zero", random_sets=3)
    assert sum(1 for a in calls if a[0] > 0) == 2  # random sets drawn by `first` and `fresh` only
    assert again.random_cpr == pytest.approx(fresh.random_cpr) and again.cpr == pytest.approx(fresh.cpr)
    assert again.ablated_area == pytest.approx(fresh.ablated_area)
    with pytest.raises(ValueError, match="band="):
        faithfulness(planted, other, EXAMPLES, ks=[3], ablation="zero", random_sets=3, band=first.band)
    with pytest.raises(ValueError, match="band="):
        faithfulness(planted, other, EXAMPLES[:3], ks=[3, 12], ablation="zero", random_sets=3, band=first.band)
