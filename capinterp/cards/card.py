"""One card per located unit (:class:`UnitCard`) and the set of them (:class:`Cards`).

A card gathers what :func:`capinterp.cards.describe` measured for one unit: its top activating
contexts and activation statistics on the corpus (:mod:`capinterp.cards.contexts`), the same
statistics on the task's prompts and the unit's specificity against a chance level, the direct
effect of its value vector on the logits (:mod:`capinterp.cards.logit_effect`), its attribution
score when the input carried scores, and its single-unit ablation effect on the task.

**Specificity.** With ``m_task`` the unit's mean activation over every token of the task's
prompts, and ``m``, ``s`` its mean and standard deviation over every token of the corpus,
``specificity = (m_task - m) / s``: how many corpus standard deviations the task moves the
unit's mean (positive: it fires more on the task). The **chance level** is the same number for
``n`` random neurons of the same layer (seeded, not among the described units), measured in the
same passes: ``chance = {"n", "mean", "q95"}`` with ``q95`` the 95th percentile of their
specificities; a unit with ``specificity > chance["q95"]`` is more task-specific than 95% of
random neurons of its layer. Layer cards have no chance level (a layer has no random peers of
the same kind in the same layer).

**Ablation.** ``ablation = {"prob", "accuracy", "delta_prob", "delta_accuracy"}``: the task's
mean target probability and accuracy (:func:`capinterp.kernels.evaluate`) with only this unit
erased (:func:`capinterp.interventions.erase`; a layer card erases every neuron of the layer's
MLP), and their change from the unablated model. Only the first ``ablate`` cards (the
top-ranked units) are ablated; the others carry None.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, overload

import pandas as pd

__all__ = ["Cards", "UnitCard", "specificity"]


def specificity(task: Any, corpus: Any) -> float | None:
    """``(task.mean - corpus.mean) / corpus.std`` for two activation statistics (objects with
    ``mean`` and ``std``); None when the corpus' std is zero or either is missing."""
    if task is None or corpus is None:
        return None
    std = float(corpus.std)
    if not std > 0 or not math.isfinite(std):
        return None
    return (float(task.mean) - float(corpus.mean)) / std


def unit_label(unit: Hashable, kind: str) -> str:
    """A unit's short name: ``L3 N17`` for neuron (3, 17), ``L3 E5`` for expert (3, 5), ``L3 H5``
    for head (3, 5), ``layer 3`` for a layer, ``{kind} {unit}`` otherwise."""
    letter = {"neuron": "N", "expert": "E", "head": "H"}.get(kind)
    if letter is not None and isinstance(unit, tuple) and len(unit) == 2:
        return f"L{unit[0]} {letter}{unit[1]}"
    return f"{kind} {unit}"


def _stats_dict(stats: Any) -> dict[str, Any] | None:
    if stats is None:
        return None
    out = {k: getattr(stats, k) for k in ("count", "mean", "std", "max", "min", "frac_positive")}
    out["quantiles"] = {str(q): float(v) for q, v in dict(stats.quantiles).items()}
    edges, counts = stats.histogram
    out["histogram"] = {"edges": [float(e) for e in edges], "counts": [int(c) for c in counts]}
    return {k: (float(v) if isinstance(v, float) else v) for k, v in out.items()}


def _context_dict(c: Any) -> dict[str, Any]:
    return {
        "text_index": int(c.text_index),
        "position": int(c.position),
        "activation": float(c.activation),
        "tokens": [str(t) for t in c.tokens],
        "values": [float(v) for v in c.values],
        "focus": int(c.focus),
    }


def _effect_dict(effect: Any) -> dict[str, Any] | None:
    if effect is None:
        return None

    def rows(r: Any) -> list[dict[str, Any]]:
        return [{"token": str(t), "id": int(i), "effect": float(e)} for t, i, e in r]

    return {"promoted": rows(effect.promoted), "suppressed": rows(effect.suppressed), "definition": effect.definition}


@dataclass
class UnitCard:
    """What one unit does (see the module docstring for each field's definition).

    ``unit`` is the key (``(layer, neuron)`` or a layer index), ``kind`` ``"neuron"`` or
    ``"layer"``; ``contexts`` the top activating contexts on the corpus (best first), ``stats``
    the corpus' activation statistics, ``task_stats`` the task prompts' (None without a task);
    ``effect`` the direct logit effect (None for a layer); ``score`` the attribution score (None
    when the input carried none); ``ablation`` None when not ablated; ``details`` the sections
    only one unit kind has (an expert's routing, a head's attention and OV circuit, a circuit's
    paths), JSON-ready, drawn by :func:`capinterp.cards.page.details_html`."""

    unit: Hashable
    kind: str
    contexts: list[Any] = field(default_factory=list)
    stats: Any = None
    task_stats: Any = None
    specificity: float | None = None
    chance: dict[str, float] | None = None
    effect: Any = None
    score: float | None = None
    ablation: dict[str, float] | None = None
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        """``L3 N17`` or ``layer 3``."""
        return unit_label(self.unit, self.kind)

    @property
    def top_tokens(self) -> list[str]:
        """The focus token of each top context, best first."""
        return [str(c.tokens[c.focus]) for c in self.contexts]

    @property
    def promoted(self) -> list[str]:
        """The tokens the unit's value vector promotes most, best first (empty for a layer)."""
        return [str(t) for t, _, _ in self.effect.promoted] if self.effect is not None else []

    @property
    def suppressed(self) -> list[str]:
        """The tokens the unit's value vector suppresses most (empty for a layer)."""
        return [str(t) for t, _, _ in self.effect.suppressed] if self.effect is not None else []

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready values."""
        return {
            "unit": list(self.unit) if isinstance(self.unit, tuple) else self.unit,
            "label": self.label,
            "kind": self.kind,
            "score": self.score,
            "specificity": self.specificity,
            "chance": self.chance,
            "ablation": self.ablation,
            "contexts": [_context_dict(c) for c in self.contexts],
            "stats": _stats_dict(self.stats),
            "task_stats": _stats_dict(self.task_stats),
            "effect": _effect_dict(self.effect),
            "details": dict(self.details),
        }


FRAME_COLUMNS = [
    "unit",
    "kind",
    "score",
    "top_tokens",
    "promoted",
    "specificity",
    "chance_q95",
    "ablation_delta_prob",
    "ablation_delta_accuracy",
]


class Cards(Sequence[UnitCard]):
    """The cards of :func:`capinterp.cards.describe`, best-ranked unit first.

    ``meta`` records what was used: the model, the corpus (``texts_source``, ``n_texts``), the
    task size, how many units the input held and how many got cards, which were ablated."""

    def __init__(self, cards: Sequence[UnitCard], meta: Mapping[str, Any] | None = None) -> None:
        self._cards = list(cards)
        self.meta: dict[str, Any] = dict(meta or {})

    @overload
    def __getitem__(self, i: int) -> UnitCard: ...
    @overload
    def __getitem__(self, i: slice) -> Cards: ...
    def __getitem__(self, i: int | slice) -> UnitCard | Cards:
        if isinstance(i, slice):
            return Cards(self._cards[i], self.meta)
        return self._cards[i]

    def __len__(self) -> int:
        return len(self._cards)

    def __iter__(self) -> Iterator[UnitCard]:
        return iter(self._cards)

    @property
    def frame(self) -> pd.DataFrame:
        """One row per card: unit, kind, score, top_tokens (focus tokens of the top contexts),
        promoted (top promoted tokens), specificity, chance_q95, ablation_delta_prob,
        ablation_delta_accuracy (None where not measured)."""
        rows = []
        for c in self._cards:
            abl = c.ablation or {}
            rows.append(
                [
                    c.label,
                    c.kind,
                    c.score,
                    " ".join(repr(t) for t in c.top_tokens[:5]),
                    " ".join(repr(t) for t in c.promoted[:5]),
                    c.specificity,
                    (c.chance or {}).get("q95"),
                    abl.get("delta_prob"),
                    abl.get("delta_accuracy"),
                ]
            )
        return pd.DataFrame(rows, columns=FRAME_COLUMNS)

    def to_dict(self) -> dict[str, Any]:
        """``{"meta": ..., "cards": [card.to_dict(), ...]}``."""
        return {"meta": self.meta, "cards": [c.to_dict() for c in self._cards]}

    def html(self) -> str:
        """The cards page: one offline HTML document (:func:`capinterp.cards.page.render`)."""
        from capinterp.cards.page import render

        return render(self)

    def save(self, path: str | os.PathLike) -> Path:
        """Write the cards page (``.html``) or, for a path ending in ``.json``, :meth:`to_dict` as
        JSON; atomically (:func:`capinterp.core.atomic.write_atomic`). Returns the path."""
        from capinterp.core.atomic import write_atomic

        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"path must be a str or Path, got {type(path).__name__}")
        if str(path).endswith(".json"):
            return write_atomic(path, json.dumps(self.to_dict(), indent=1, default=_plain))
        return write_atomic(path, self.html())

    def _repr_html_(self) -> str:
        from capinterp.cards.page import render

        return render(self, full=False)

    def __repr__(self) -> str:
        return (
            f"Cards({len(self)} units: {', '.join(c.label for c in self._cards[:5])}{', ...' if len(self) > 5 else ''})"
        )


def _plain(o: Any) -> Any:
    if hasattr(o, "item"):
        return o.item()
    if hasattr(o, "tolist"):
        return o.tolist()
    return str(o)
