"""One layer, one protocol: ``UnitSet`` membership (not attribute probes) decides how a set is read."""

from __future__ import annotations

import pytest
import torch

from capinterp.units import KeySet, NeuronScores, NeuronSet, UnitSet, check_comparable
from capinterp.units.counts import neuron_mask, set_counts
from capinterp.units.neurons import load


class _LooksLikeNeurons(KeySet):
    """Keyed neuron units that carry a ``mask`` attribute disagreeing with their keys."""

    def __init__(self, keys: set[tuple[int, int]]) -> None:
        super().__init__(keys, "neuron", ("neuron", 2, 3))
        self.mask = torch.ones(2, 3, dtype=torch.bool)  # 6 "located" by attribute, not by keys


def test_only_a_neuron_set_takes_the_tensor_path():
    fake = _LooksLikeNeurons({(0, 0), (1, 2)})
    assert neuron_mask(fake) is None  # an attribute named mask does not make a NeuronSet
    other = _LooksLikeNeurons({(1, 2)})
    assert set_counts(fake, other) == (1, 2, 1)  # by keys: {(1, 2)}; a mask probe would have said 6
    real = NeuronSet(torch.tensor([[True, False, False], [False, False, True]]))
    assert neuron_mask(real) is real.mask
    assert set_counts(real, NeuronSet(torch.tensor([[False] * 3, [False, False, True]]))) == (1, 2, 1)


def test_every_unit_set_has_meta_and_keysets_start_empty():
    layers = KeySet.layers([1, 2], n_layers=4)
    assert isinstance(layers, UnitSet) and dict(layers.meta) == {}
    with pytest.raises(TypeError):
        layers.meta["model"] = "x"  # type: ignore[index]  # the shared default is read-only
    ns = NeuronSet(torch.eye(3, dtype=torch.bool), {"model_fingerprint": "a"})
    assert isinstance(ns, UnitSet) and ns.meta["model_fingerprint"] == "a"
    check_comparable(ns, NeuronSet(torch.eye(3, dtype=torch.bool)))  # one side without a fingerprint
    with pytest.raises(ValueError, match="different models"):
        check_comparable(ns, NeuronSet(torch.eye(3, dtype=torch.bool), {"model_fingerprint": "b"}))


def test_scores_are_not_a_unit_set_and_load_returns_the_saved_class(tmp_path):
    sc = NeuronScores(torch.tensor([[0.0, 3.0], [1.0, -1.0]]))
    assert not isinstance(sc, UnitSet)
    back = load(sc.save(tmp_path / "s.capi"))
    assert type(back) is NeuronScores and torch.equal(back.scores, sc.scores)
    top = sc.top_k(1)
    back_set = load(top.save(tmp_path / "n.capi"))
    assert type(back_set) is NeuronSet and set(back_set) == {(0, 1)}
