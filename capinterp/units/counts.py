"""|A ∩ B|, |A|, |B| of two unit sets after checking they are comparable: what every set metric
(:mod:`capinterp.units.metrics`) and its chance level (:mod:`capinterp.units.chance`) start from."""

from __future__ import annotations

from jaxtyping import Bool
from torch import Tensor

from capinterp.units.base import UnitSet, check_comparable
from capinterp.units.neuron_set import NeuronSet

__all__ = ["SetLike", "keys_of", "neuron_mask", "set_counts"]

SetLike = UnitSet | set | frozenset


def neuron_mask(a: object) -> Bool[Tensor, "n_layers d_mlp"] | None:
    """The bool ``[n_layers, d_mlp]`` mask of a neuron set (the tensor fast path), else None."""
    return a.mask if isinstance(a, NeuronSet) else None


def keys_of(a: SetLike) -> frozenset:
    if isinstance(a, UnitSet):
        return a.keys()
    if isinstance(a, (set, frozenset)):
        return frozenset(a)
    raise TypeError(f"expected a UnitSet or a set of unit keys, got {type(a).__name__}")


def set_counts(a: SetLike, b: SetLike, across_models: bool = False) -> tuple[int, int, int]:
    """(|A ∩ B|, |A|, |B|), after checking that the two sets are comparable (see
    :func:`capinterp.units.base.check_comparable` for ``across_models``)."""
    if isinstance(a, UnitSet) and isinstance(b, UnitSet):
        check_comparable(a, b, across_models=across_models)
        ma, mb = neuron_mask(a), neuron_mask(b)
        if ma is not None and mb is not None:
            return int((ma & mb).sum()), len(a), len(b)
    ka, kb = keys_of(a), keys_of(b)
    return len(ka & kb), len(ka), len(kb)
