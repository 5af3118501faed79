"""The :class:`Plan` of :func:`capinterp.cards.inputs.resolve_units`: what describe is asked to describe.

In a module of its own so that the unit kinds' plan makers (:mod:`capinterp.cards.circuits`, ...)
build one without importing ``inputs`` back."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Plan"]


@dataclass
class Plan:
    """The units to describe: ``kind`` ("neuron" or "layer"), ``keys`` in rank order (already cut
    to ``top``), ``scores`` (key -> attribution score, None when the input has none), ``n_total``
    (units the input held) and ``source`` (what the input was, for the cards' meta)."""

    kind: str
    keys: list[Any]
    scores: dict[Any, float] | None
    n_total: int
    source: str
