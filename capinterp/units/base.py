"""The shared "located units" interface: the one protocol every located set follows.

Localizers locate different kinds of units: FFN neurons ``(layer, index)``, whole layers
(causal tracing's top MLP layers), circuit edges or nodes. Each result is a :class:`UnitSet`:

- ``kind``: the unit kind, e.g. ``"neuron"``, ``"layer"``, ``"edge"``, ``"node"``;
- ``space``: a hashable description of the universe the units come from, e.g.
  ``("neuron", n_layers, d_mlp)`` or ``("layer", n_layers)``. Two sets are comparable (set algebra,
  metrics) only when their ``kind`` and ``space`` are equal;
- ``keys()``: a frozenset of hashable unit ids; ``len``, ``iter`` (sorted when the keys sort) and
  ``in`` follow from it;
- ``ratio`` = |U| / n_units, the share of all units of the space (needs ``n_units``);
- ``param_share`` = sum_{u in U} params(u) / n_params, the share of the model's parameters the
  units own (needs per-unit parameter counts and the model's total);
- ``meta``: a read-only mapping of provenance (``model``, ``model_fingerprint``, ...), empty unless
  the set records one;
- set algebra ``&``, ``|``, ``-``, ``^`` between comparable sets of one concrete type.

Code that must tell a set of units from something else asks ``isinstance(x, UnitSet)`` (and
``isinstance(x, NeuronSet)`` for the tensor fast path), never probes attributes.
:class:`KeySet` is the plain concrete set for layers, edges and nodes;
:class:`capinterp.units.neuron_set.NeuronSet` is the tensor-backed set for neurons.
"""

from __future__ import annotations

import copy
import os
from abc import ABC, abstractmethod
from collections.abc import Hashable, Iterable, Iterator, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from capinterp.units.saved import IDENTITY_UNKNOWN, check_model_identity

if TYPE_CHECKING:
    from capinterp.core.protocol import Model

__all__ = ["KeySet", "UnitSet", "check_comparable"]

#: The metadata a set derived by set algebra keeps from its operands (the model's identity).
_MODEL_KEYS = ("model", "model_fingerprint", "architecture_fingerprint", "n_params", IDENTITY_UNKNOWN)


class UnitSet(ABC):
    """Abstract set of located units. Subclasses implement ``kind``, ``space`` and ``keys()``.

    Parameter accounting hooks (override or pass to :class:`KeySet`): ``unit_params`` is either one
    int (every unit owns that many parameters) or a mapping key -> int; ``n_params`` is the model's
    total parameter count; ``n_units`` is the size of the universe.
    """

    kind: str = "unit"
    meta: Mapping[str, Any] = MappingProxyType({})  # provenance; sets that record one set their own

    @property
    @abstractmethod
    def space(self) -> Hashable:
        """Hashable description of the universe, e.g. ``("neuron", n_layers, d_mlp)``."""

    @abstractmethod
    def keys(self) -> frozenset:
        """Frozenset of the hashable unit ids in this set."""

    # --- accounting hooks --------------------------------------------------------------------
    @property
    def unit_params(self) -> int | Mapping[Hashable, int] | None:
        """Parameters per unit: one number, a mapping key -> number, or None when unknown."""
        return None

    @property
    def n_params(self) -> int | None:
        """Parameters of the whole model, or None when unknown."""
        return None

    @property
    def n_units(self) -> int | None:
        """Number of units in the space, or None when unknown."""
        return None

    # --- derived -----------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.keys())

    def __iter__(self) -> Iterator[Hashable]:
        ks = self.keys()
        try:
            return iter(sorted(ks))
        except TypeError:  # keys of mixed, unorderable types
            return iter(sorted(ks, key=repr))

    def __contains__(self, key: object) -> bool:
        try:
            return key in self.keys()
        except TypeError:  # unhashable key
            return False

    @property
    def ratio(self) -> float:
        """|U| / n_units: the share of all units of the space that this set holds."""
        n = self.n_units
        if not n:
            raise ValueError(
                f"ratio of a {type(self).__name__} of kind {self.kind!r} needs the universe size; "
                "pass n_units when building it"
            )
        return len(self) / n

    def param_count(self) -> int:
        """sum_{u in U} params(u), from ``unit_params``; ValueError when unknown."""
        up = self.unit_params
        if up is None:
            raise ValueError(
                f"parameter count of a {type(self).__name__} of kind {self.kind!r} is unknown: "
                "give per-unit parameter counts (unit_params / params_per_neuron) when building it"
            )
        if isinstance(up, Mapping):
            missing = [k for k in self.keys() if k not in up]
            if missing:
                raise ValueError(f"unit_params has no count for units {sorted(missing, key=repr)[:5]}")
            return int(sum(int(up[k]) for k in self.keys()))
        return int(up) * len(self)

    @property
    def param_share(self) -> float:
        """param_count / n_params: the share of the model's parameters the units own."""
        total = self.n_params
        if not total:
            raise ValueError(
                f"param_share of a {type(self).__name__} of kind {self.kind!r} needs the model's "
                "total parameter count: pass n_params when building it"
            )
        return self.param_count() / int(total)

    def is_comparable(self, other: UnitSet) -> bool:
        """True when ``other`` holds units of the same kind over the same space."""
        return self.kind == other.kind and self.space == other.space


def check_comparable(a: UnitSet, b: UnitSet, *, across_models: bool = False) -> None:
    """Raise ValueError unless ``a`` and ``b`` have the same kind and space, and (where both
    record one) the same model fingerprint: equal shapes from different models are not comparable.

    ``across_models=True`` is for sets located on different checkpoints of one architecture (a
    base model and its fine-tune): only the architecture fingerprint must then agree."""
    if a.kind != b.kind or a.space != b.space:
        raise ValueError(
            f"cannot compare unit sets of different kinds or spaces: {a.kind!r} over {a.space!r} "
            f"vs {b.kind!r} over {b.space!r}"
        )
    key = "architecture_fingerprint" if across_models else "model_fingerprint"
    fa, fb = (x.meta.get(key) for x in (a, b))
    if fa is not None and fb is not None and str(fa) != str(fb):
        ma, mb = (x.meta.get("model") for x in (a, b))
        what = "architectures" if across_models else "models (weights or config)"
        hint = "" if across_models else "; pass across_models=True to compare checkpoints of one architecture"
        raise ValueError(
            f"cannot compare unit sets of different {what}: model {ma!r} ({key} {fa!r}) vs "
            f"model {mb!r} ({key} {fb!r}){hint}"
        )


class KeySet(UnitSet):
    """A frozenset of unit keys with a kind, a space and optional parameter accounting.

    >>> top = KeySet.layers([4, 5, 6], n_layers=30)
    >>> top.ratio  # 3 / 30
    0.1

    ``meta`` records provenance (a localizer's ``meta_``: method, parameters, the model's identity);
    :meth:`save` writes it with the set and a checksum, :meth:`load` reads it back and, given
    ``model=``, refuses a set made for another model (:meth:`check_model`).
    """

    def __init__(
        self,
        keys: Iterable[Hashable],
        kind: str,
        space: Hashable | None = None,
        *,
        unit_params: int | Mapping[Hashable, int] | None = None,
        n_params: int | None = None,
        n_units: int | None = None,
        meta: Mapping[str, Any] | None = None,
    ) -> None:
        if not isinstance(kind, str) or not kind:
            raise ValueError("kind must be a non-empty string such as 'layer', 'edge' or 'node'")
        self._keys = frozenset(keys)
        self.kind = kind
        self._space = (kind,) if space is None else space
        hash(self._space)
        self._unit_params = dict(unit_params) if isinstance(unit_params, Mapping) else unit_params
        self._n_params = n_params
        self._n_units = n_units
        if meta is not None and not isinstance(meta, Mapping):
            raise TypeError(f"meta must be a mapping, got {type(meta).__name__}")
        self._meta: Mapping[str, Any] = MappingProxyType(dict(meta or {}))

    @property
    def meta(self) -> Mapping[str, Any]:  # type: ignore[override]  # a read-only view per instance
        """Read-only provenance (``method``, ``model``, ``model_fingerprint``, ...); empty unless recorded."""
        return self._meta

    def with_meta(self, meta: Mapping[str, Any]) -> KeySet:
        """A copy of this set (of the same class) that records ``meta``."""
        if not isinstance(meta, Mapping):
            raise TypeError(f"meta must be a mapping, got {type(meta).__name__}")
        out = copy.copy(self)
        out._meta = MappingProxyType(dict(meta))
        return out

    # --- save / load ---------------------------------------------------------------------------
    def save(self, path: str | os.PathLike, *, overwrite: bool = False) -> Path:
        """Write the set to ``path`` as JSON: kind, space, keys (tuples and other hashable keys read
        back exactly), parameter accounting, ``meta`` (the model's identity) and a checksum over all
        of it (:mod:`capinterp.units.keyset_io`). Atomic; ValueError if ``path`` holds anything but a
        saved KeySet, unless ``overwrite=True``; TypeError for a key that cannot be written. A
        subclass (e.g. ``EdgeSet``) saves its keys, kind and space, and loads back as a KeySet."""
        from capinterp.units.keyset_io import write_keyset

        return write_keyset(self, path, overwrite=overwrite)

    @classmethod
    def load(cls, path: str | os.PathLike, *, model: Model | None = None, across_models: bool = False) -> KeySet:
        """Read a set written by :meth:`save`, verifying its checksum (ValueError naming the file when
        it is damaged or no saved KeySet). A file without ``meta["model_fingerprint"]`` is marked
        ``identity_unknown``; ``model=`` checks the set against that model (:meth:`check_model`)."""
        from capinterp.units.keyset_io import read_keyset

        if cls is not KeySet:  # a subclass keeps its own format (EdgeSet: Circuit.save / load)
            raise TypeError(f"{cls.__name__}.load: KeySet.load reads plain KeySet files only")
        ks = KeySet(**read_keyset(path))
        if model is not None:
            ks.check_model(model, across_models=across_models)
        return ks

    def check_model(self, model: Model, *, across_models: bool = False) -> None:
        """ValueError unless this set can be applied to ``model``: a layer set over as many layers,
        and (when both are known) the same model fingerprint, or with ``across_models=True`` the same
        architecture. A set loaded from a file without model identity is refused unless ``across_models``."""
        from capinterp.core import validate

        validate.model(model)
        n_layers = int(model.cfg.n_layers)
        if self.kind == "layer" and self._space != ("layer", n_layers):
            raise ValueError(f"this layer set is over {self._space!r}; the model has {n_layers} layers")
        check_model_identity(self.meta, "KeySet", model, across_models)

    @classmethod
    def layers(cls, layers: Iterable[int], n_layers: int, **kw: Any) -> KeySet:
        """Layer set over the space ``("layer", n_layers)``; ``n_units`` defaults to n_layers."""
        layers = [int(x) for x in layers]
        bad = [x for x in layers if not 0 <= x < n_layers]
        if bad:
            raise ValueError(f"layers {bad} out of range for a model with {n_layers} layers")
        kw.setdefault("n_units", n_layers)
        return cls(layers, "layer", ("layer", int(n_layers)), **kw)

    @property
    def space(self) -> Hashable:
        """The universe the keys come from (e.g. ``("layer", n_layers)``)."""
        return self._space

    def keys(self) -> frozenset:
        """The located keys."""
        return self._keys

    @property
    def unit_params(self) -> int | Mapping[Hashable, int] | None:
        """Parameters per unit: one number, a mapping key -> number, or None when unknown."""
        return self._unit_params

    @property
    def n_params(self) -> int | None:
        """Parameters of the whole model, or None when unknown."""
        return self._n_params

    @property
    def n_units(self) -> int | None:
        """Number of units in the space, or None when unknown."""
        return self._n_units

    def _combine(self, other: object, keys: frozenset) -> KeySet:
        assert isinstance(other, KeySet)
        return KeySet(
            keys,
            self.kind,
            self._space,
            unit_params=self._unit_params if self._unit_params is not None else other._unit_params,
            n_params=self._n_params if self._n_params is not None else other._n_params,
            n_units=self._n_units if self._n_units is not None else other._n_units,
            meta={k: v for k, v in self._meta.items() if k in _MODEL_KEYS and other._meta.get(k, v) == v},
        )

    def _checked(self, other: object) -> KeySet:
        if not isinstance(other, KeySet):
            raise TypeError(f"cannot combine KeySet with {type(other).__name__}")
        check_comparable(self, other)
        return other

    def __and__(self, other: KeySet) -> KeySet:
        return self._combine(other, self._keys & self._checked(other)._keys)

    def __or__(self, other: KeySet) -> KeySet:
        return self._combine(other, self._keys | self._checked(other)._keys)

    def __sub__(self, other: KeySet) -> KeySet:
        return self._combine(other, self._keys - self._checked(other)._keys)

    def __xor__(self, other: KeySet) -> KeySet:
        return self._combine(other, self._keys ^ self._checked(other)._keys)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, KeySet):
            return NotImplemented
        return self.kind == other.kind and self._space == other._space and self._keys == other._keys

    def __hash__(self) -> int:
        return hash((self.kind, self._space, self._keys))

    def __repr__(self) -> str:
        shown = list(self)[:6]
        more = ", ..." if len(self) > 6 else ""
        keys = ", ".join(map(repr, shown)) + more
        return f"KeySet(kind={self.kind!r}, space={self._space!r}, n={len(self)}, keys=[{keys}])"
