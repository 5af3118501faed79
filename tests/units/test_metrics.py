"""Metrics over located sets: hand-computed cases and edge conventions."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from capinterp.units import metrics as M
from capinterp.units.base import KeySet
from capinterp.units.neurons import NeuronSet

A_KEYS = {(0, 1), (0, 2), (1, 3)}
B_KEYS = {(0, 2), (1, 3), (1, 4), (2, 0)}


def ns(keys, shape=(3, 5), meta=None):
    return NeuronSet.from_indices(keys, *shape, meta=meta)


@pytest.fixture(params=["neuronset", "keyset", "pyset"])
def ab(request):
    if request.param == "neuronset":
        return ns(A_KEYS), ns(B_KEYS)
    if request.param == "keyset":
        space = ("neuron", 3, 5)
        return KeySet(A_KEYS, "neuron", space), KeySet(B_KEYS, "neuron", space)
    return set(A_KEYS), frozenset(B_KEYS)


def test_hand_computed_pair(ab):
    a, b = ab
    assert M.intersection_size(a, b) == 2
    assert M.overlap(a, b) == pytest.approx(2 / 3)
    assert M.iou(a, b) == pytest.approx(2 / 5)
    assert M.cohesion(a, b) == pytest.approx(2 / 4)
    assert M.separability(a, b) == pytest.approx(2 / 4)
    assert M.overlap(b, a) == M.overlap(a, b) and M.iou(b, a) == M.iou(a, b)


def test_neuronset_against_keyset_and_plain_set():
    space = ("neuron", 3, 5)
    assert M.iou(ns(A_KEYS), KeySet(B_KEYS, "neuron", space)) == pytest.approx(0.4)
    assert M.overlap(ns(A_KEYS), B_KEYS) == pytest.approx(2 / 3)


def test_empty_set_conventions():
    e1, e2, a = ns([]), ns([]), ns(A_KEYS)
    for fn in (M.overlap, M.iou, M.cohesion, M.separability):
        assert fn(e1, e2) == 1.0
        assert fn(e1, a) == 0.0 and fn(a, e1) == 0.0
    assert M.intersection_size(e1, a) == 0
    assert M.overlap(set(), set()) == 1.0


def test_identical_and_disjoint():
    a = ns(A_KEYS)
    assert M.overlap(a, a) == M.iou(a, a) == M.cohesion(a, a) == 1.0
    d = ns({(2, 4), (2, 3)})
    assert M.overlap(a, d) == M.iou(a, d) == 0.0


def test_overlap_of_subset_is_one_but_iou_is_not():
    small, big = ns({(0, 1)}), ns({(0, 1), (0, 2), (0, 3), (0, 4)})
    assert M.overlap(small, big) == 1.0
    assert M.iou(small, big) == pytest.approx(0.25) and M.cohesion(small, big) == pytest.approx(0.25)


def test_mismatched_shapes_and_kinds_raise():
    with pytest.raises(ValueError, match="kinds or spaces"):
        M.overlap(ns(A_KEYS), ns(A_KEYS, shape=(4, 5)))
    with pytest.raises(ValueError, match="kinds or spaces"):
        M.iou(ns(A_KEYS), KeySet.layers([0, 1], n_layers=3))
    with pytest.raises(ValueError):
        M.consistency([ns(A_KEYS), ns(A_KEYS, shape=(3, 6))])
    with pytest.raises(TypeError):
        M.overlap([1, 2], {1})
    same_shape_other_model = ns(A_KEYS, meta={"model_fingerprint": "bbb", "model": "other"})
    with pytest.raises(ValueError, match="different models"):
        M.overlap(ns(A_KEYS, meta={"model_fingerprint": "aaa"}), same_shape_other_model)
    assert M.overlap(ns(A_KEYS), same_shape_other_model) == 1.0  # no fingerprint recorded: keys only


def test_ratio_and_param_share():
    a = ns(A_KEYS, meta={"params_per_neuron": 4, "n_params": 120})
    assert M.ratio(a) == pytest.approx(3 / 15)
    assert M.param_share(a) == pytest.approx(12 / 120)
    layers = KeySet.layers([1, 2], n_layers=8, unit_params=50, n_params=1000)
    assert M.ratio(layers) == pytest.approx(0.25) and M.param_share(layers) == pytest.approx(0.1)
    with pytest.raises(ValueError):
        M.param_share(ns(A_KEYS))
    with pytest.raises(ValueError, match="n_units"):
        M.ratio(KeySet({"e1"}, "edge"))
    with pytest.raises(TypeError):
        M.ratio({(0, 1)})


def test_pairwise_and_mean_pairwise():
    sets = {"a": ns(A_KEYS), "b": ns(B_KEYS), "c": ns({(2, 4)})}
    df = M.pairwise(sets, "overlap")
    assert list(df.index) == list(df.columns) == ["a", "b", "c"]
    assert np.allclose(np.diag(df.to_numpy()), 1.0)
    assert df.loc["a", "b"] == pytest.approx(2 / 3) and df.loc["b", "a"] == pytest.approx(2 / 3)
    assert df.loc["a", "c"] == 0.0
    assert M.mean_pairwise(sets, "iou") == pytest.approx((0.4 + 0 + 0) / 3)
    assert list(M.pairwise([ns(A_KEYS), ns(B_KEYS)], "iou").index) == [0, 1]
    assert M.pairwise(sets, M.intersection_size).loc["a", "b"] == 2
    with pytest.raises(ValueError, match="unknown metric"):
        M.pairwise(sets, "dice")
    with pytest.raises(ValueError, match="two sets"):
        M.mean_pairwise([ns(A_KEYS)])


def test_consistency_hand_cases():
    a = ns(A_KEYS)
    assert M.consistency([a, a, a]) == (1.0, 1.0)
    d1, d2, d3 = ns({(0, 0)}), ns({(1, 1)}), ns({(2, 2)})
    assert M.consistency([d1, d2, d3]) == (0.0, 0.0)
    # N1={1,2,3}, N2={2,3,4}, N3={3,4,5}: CS1 = |{3}|/|{1..5}| = 1/5;
    # Jaccards: (N1,N2)=2/4, (N1,N3)=1/5, (N2,N3)=2/4 -> CS2 = 1.2/3 = 0.4
    sets = [ns({(0, i - 1) for i in r}) for r in ({1, 2, 3}, {2, 3, 4}, {3, 4, 5})]
    cs1, cs2 = M.consistency(sets)
    assert cs1 == pytest.approx(0.2) and cs2 == pytest.approx(0.4)
    keyed = [{("x", i) for i in r} for r in ({1, 2, 3}, {2, 3, 4}, {3, 4, 5})]
    assert M.consistency(keyed) == pytest.approx((0.2, 0.4))
    assert M.consistency({"q1": sets[0], "q2": sets[1]}) == pytest.approx((0.5, 0.5))


def test_consistency_edges():
    with pytest.raises(ValueError):
        M.consistency([])
    assert M.consistency([ns(A_KEYS)]) == (1.0, 1.0)
    assert M.consistency([ns([]), ns([])]) == (1.0, 1.0)


def test_ipp():
    assert M.ipp(0.8, [0.5, 0.6, 0.55]) == pytest.approx(0.2)
    assert M.ipp(0.5, [0.6, 0.1]) == pytest.approx(-0.1)
    # accuracy after erasure: lower is better; located 0.2 vs random min 0.7 -> +0.5
    assert M.ipp(0.2, [0.9, 0.7], higher_is_better=False) == pytest.approx(0.5)
    # the same as passing drops from a 1.0 baseline with higher_is_better=True
    assert M.ipp(1 - 0.2, [1 - 0.9, 1 - 0.7]) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        M.ipp(0.5, [])


def test_otsu_splits_bimodal_sample():
    rng = np.random.default_rng(0)
    low, high = rng.normal(0.1, 0.03, 300), rng.normal(0.8, 0.05, 200)
    t = M.otsu_threshold(np.concatenate([low, high]))
    assert low.max() < t < high.min()
    # the threshold sits in the middle of the gap, not at its edge
    gap_mid = (low.max() + high.min()) / 2
    assert abs(t - gap_mid) < 0.1 * (high.min() - low.max()) + 0.01
    assert M.otsu_threshold(torch.tensor([0.0, 0.0, 1.0, 1.0])) == pytest.approx(0.5, abs=0.01)


def test_otsu_unequal_modes_and_edges():
    v = np.array([0.0] * 90 + [0.2] * 5 + [1.0] * 5)
    # between-class variance: {0}|{.2,1}: .9*.1*(0-.6)^2 = .0324; {0,.2}|{1}: .95*.05*(1/95-1)^2 = .0465
    t = M.otsu_threshold(v)
    assert 0.2 < t < 1.0 and (v >= t).sum() == 5
    assert M.otsu_threshold([3.0, 3.0]) == 3.0
    with pytest.raises(ValueError):
        M.otsu_threshold([])
    with pytest.raises(ValueError):
        M.otsu_threshold([0.0, np.nan])
