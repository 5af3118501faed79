"""A located set of FFN neurons: a bool ``[n_layers, d_mlp]`` mask over ``blocks.{l}.mlp.hook_post``.

:class:`NeuronSet` is the tensor-backed :class:`~capinterp.units.base.UnitSet` of kind ``"neuron"``;
its keys are ``(layer, index)`` tuples. Set algebra (``&``, ``|``, ``-``, ``^``) needs the same shape
and, where both record one, the same model fingerprint. ``random_like`` draws the seeded random
controls (same size, optionally per layer and / or disjoint); their metadata records ``random_control``.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Iterator
from typing import Any, cast

import numpy as np
import pandas as pd
import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from capinterp.core import validate
from capinterp.units.base import UnitSet
from capinterp.units.neuron_tensor import NeuronTensor

__all__ = ["NeuronSet"]


def _ig_note(meta: dict) -> str:
    """``; IG rule right:20 (the papers' approximation): completeness error max ...`` for IG results."""
    from capinterp.units.ig_report import report_line

    line = report_line(meta.get("ig_check"))
    return f"; {line}" if line else ""


class NeuronSet(NeuronTensor, UnitSet):
    """A located set of neurons: bool mask [n_layers, d_mlp]; keys are ``(layer, index)`` tuples."""

    kind = "neuron"
    meta: dict[str, Any]  # the NeuronTensor's mutable metadata serves as the UnitSet's meta
    _tensor_name = "mask"
    _stored_dtype = torch.uint8
    __hash__ = None  # type: ignore[assignment]  # mutable and compared by value: unhashable

    def __init__(self, mask: Bool[Tensor, "n_layers d_mlp"] | np.ndarray, meta: dict | None = None) -> None:
        t = self._as_2d(mask, "mask")
        if t.dtype != torch.bool:
            if not ((t == 0) | (t == 1)).all():
                raise ValueError("mask must be boolean or hold only 0/1 values")
            t = t != 0
        self.mask: Bool[Tensor, "n_layers d_mlp"] = t.clone().contiguous()
        self._init_meta(meta)
        if self.padded and (outside := int((self.mask & ~self.valid).sum())):
            raise ValueError(
                f"mask holds {outside} padding neurons: positions past a layer's own width "
                f"(meta['layer_widths'] {self.meta['layer_widths']!r:.120}) are not neurons of the model"
            )

    def _data(self) -> Tensor:
        return self.mask

    # --- UnitSet interface ---------------------------------------------------------------------
    space = property(lambda self: ("neuron", self.n_layers, self.d_mlp), doc='("neuron", n_layers, d_mlp)')
    n_units = property(
        lambda self: int(self.valid.sum()), doc="the model's neurons: L * d_mlp, or the layers' own widths summed"
    )
    unit_params = property(lambda self: self.meta.get("params_per_neuron"), doc="meta['params_per_neuron']")
    n_params = property(lambda self: self.meta.get("n_params"), doc="meta['n_params']")

    def keys(self) -> frozenset[tuple[int, int]]:
        """The located neurons as ``(layer, index)`` pairs."""
        return frozenset(self)

    def __len__(self) -> int:
        return int(self.mask.sum())

    def __iter__(self) -> Iterator[tuple[int, int]]:
        """(layer, index) pairs in sorted order."""
        return ((p[0], p[1]) for p in self.mask.nonzero().tolist())

    def __contains__(self, key: object) -> bool:
        try:
            layer, idx = map(operator.index, cast("Iterable[Any]", key))  # ValueError unless two items
        except (TypeError, ValueError):
            return False
        return 0 <= layer < self.n_layers and 0 <= idx < self.d_mlp and bool(self.mask[layer, idx])

    @property
    def param_share(self) -> float:
        """|N| * params_per_neuron / n_params, both from ``meta``."""
        missing = [k for k in ("params_per_neuron", "n_params") if not self.meta.get(k)]
        if missing:
            raise ValueError(f"NeuronSet.param_share needs meta {missing} (localizers record them from the model)")
        return len(self) * int(self.meta["params_per_neuron"]) / int(self.meta["n_params"])

    # --- set algebra ---------------------------------------------------------------------------
    def _binop(self, other: object, fn: Any, op: str) -> NeuronSet:
        if not isinstance(other, NeuronSet):
            return NotImplemented
        if other.shape != self.shape:
            raise ValueError(f"cannot apply {op!r} to NeuronSets of shapes {self.shape} and {other.shape}")
        fa, fb = self.meta.get("model_fingerprint"), other.meta.get("model_fingerprint")
        if fa is not None and fb is not None and fa != fb:
            raise ValueError(f"cannot apply {op!r} to NeuronSets of different models (fingerprint {fa!r} vs {fb!r})")
        return NeuronSet(fn(self.mask, other.mask), self._model_meta(other))

    __and__ = lambda self, other: self._binop(other, torch.logical_and, "&")  # noqa: E731
    __or__ = lambda self, other: self._binop(other, torch.logical_or, "|")  # noqa: E731
    __sub__ = lambda self, other: self._binop(other, lambda a, b: a & ~b, "-")  # noqa: E731
    __xor__ = lambda self, other: self._binop(other, torch.logical_xor, "^")  # noqa: E731

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, NeuronSet):
            return NotImplemented
        return self.shape == other.shape and bool(torch.equal(self.mask, other.mask))

    # --- constructors and views ----------------------------------------------------------------
    @classmethod
    def from_indices(
        cls, pairs: Iterable[tuple[int, int]], n_layers: int, d_mlp: int, meta: dict[str, Any] | None = None
    ) -> NeuronSet:
        """Build from (layer, index) pairs; ValueError for pairs out of range."""
        mask = torch.zeros(int(n_layers), int(d_mlp), dtype=torch.bool)
        for pair in pairs:
            layer, idx = (operator.index(v) for v in pair)
            if not (0 <= layer < n_layers and 0 <= idx < d_mlp):
                raise ValueError(f"neuron {(layer, idx)} out of range for shape ({n_layers}, {d_mlp})")
            mask[layer, idx] = True
        return cls(mask, meta)

    def empty_like(self) -> NeuronSet:
        """An empty set over the same model (same shape and model metadata)."""
        return NeuronSet(torch.zeros_like(self.mask), self._model_meta())

    def random_like(self, seed: int, per_layer: bool = False, disjoint: bool = False) -> NeuronSet:
        """Seeded random set of the same size; ``per_layer`` matches each layer's count, ``disjoint``
        draws only neurons outside this set (random-control arms)."""
        g = torch.Generator().manual_seed(validate.integer("seed", seed))
        rows = self.mask if per_layer else self.mask.view(1, -1)
        real = self.valid if per_layer else self.valid.view(1, -1)  # padding neurons are never drawn
        out = torch.zeros_like(rows)
        for r, (row, count) in enumerate(zip(rows, rows.sum(dim=1).tolist())):
            pool = (real[r] & ~row if disjoint else real[r]).nonzero().flatten()
            if count > pool.numel():
                raise ValueError(f"cannot draw {count} disjoint random neurons from {pool.numel()} left")
            out[r, pool[torch.randperm(pool.numel(), generator=g)[:count]]] = True
        meta = self._model_meta()
        meta["random_control"] = {"seed": int(seed), "per_layer": bool(per_layer), "disjoint": bool(disjoint)}
        return NeuronSet(out.view(self.shape), meta)

    def per_layer(self) -> Int[Tensor, " n_layers"]:
        """Located neurons per layer, int64 [n_layers]."""
        return self.mask.sum(dim=1)

    def to_frame(self, scores: NeuronTensor | Float[Tensor, "n_layers d_mlp"] | None = None) -> pd.DataFrame:
        """Columns layer, neuron, sorted by layer then neuron; with ``scores``, a score column too and
        the rows ranked by score, largest first (ties by layer, neuron), as
        :meth:`~capinterp.units.neuron_scores.NeuronScores.to_frame` ranks its ``top`` rows."""
        idx = self.mask.nonzero().numpy().reshape(-1, 2)
        df = pd.DataFrame({"layer": idx[:, 0], "neuron": idx[:, 1]})
        if scores is not None:
            s = scores._data() if isinstance(scores, NeuronTensor) else torch.as_tensor(scores)
            if tuple(s.shape) != self.shape:
                raise ValueError(f"scores shape {tuple(s.shape)} does not match the set's {self.shape}")
            df["score"] = s[self.mask].float().numpy()
            df = df.sort_values("score", ascending=False, kind="stable").reset_index(drop=True)
        return df

    def __repr__(self) -> str:
        n = len(self)
        layers = [i for i, c in enumerate(self.per_layer().tolist()) if c]
        shown = ", ".join(map(str, layers[:8])) + (", ..." if len(layers) > 8 else "")
        return (
            f"NeuronSet({n} of {self.n_layers}x{self.d_mlp} neurons ({self.ratio:.3%}), "
            f"method={self.meta.get('method')!r}, layers=[{shown}]{_ig_note(self.meta)})"
        )
