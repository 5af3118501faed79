"""What :func:`capinterp.cards.describe` accepts, checked before any forward pass.

:func:`resolve_units` turns the ``units`` argument into a :class:`Plan` (the unit kind, the keys
to describe in rank order, their scores when the input carries scores, and how many units the
input held), refusing an empty set, a result made for another model, and the unit kinds cards do
not cover yet. :func:`resolve_texts` turns ``texts`` into the corpus and says where it came from.
"""

from __future__ import annotations

import json
import os
from collections.abc import Hashable, Sequence
from pathlib import Path
from typing import Any

from capinterp.cards.plan import Plan
from capinterp.core.example import Example
from capinterp.units.base import KeySet
from capinterp.units.neurons import NeuronScores, NeuronSet

__all__ = ["PLANNED", "TEXT_SUFFIXES", "Plan", "builtin_texts", "read_texts", "resolve_texts", "resolve_units"]

TEXT_SUFFIXES = (".txt", ".jsonl")
#: Unit kinds the issue plans cards for that are not built yet: what each still needs.
PLANNED: dict[str, str] = {}


def _planned(kind: str) -> NotImplementedError:
    what = PLANNED.get(kind, f"cards for units of kind {kind!r}")
    return NotImplementedError(
        f"describe does not cover {kind!r} units yet: {what} are planned; it describes neurons "
        "(NeuronSet, NeuronScores, a fitted neuron localizer) and layers (a layer KeySet, causal tracing)"
    )


def _ranked(keys: Sequence[Any], scores: dict[Any, float] | None, top: int) -> list[Any]:
    if scores is None:
        return sorted(keys)[:top]
    return sorted(keys, key=lambda u: (-scores[u], u))[:top]


def _neuron_scores(scores: NeuronScores, keys: Sequence[tuple[int, int]]) -> dict[Hashable, float]:
    s = scores.scores
    return {(layer, n): float(s[layer, n]) for layer, n in keys}


def _from_localizer(model: Any, loc: Any, top: int, across: bool) -> Plan:
    kind = type(loc).unit_kind
    if kind in ("edge", "node"):  # a circuit localizer: its circuit_ (capinterp.cards.circuits)
        from capinterp.cards.circuits import circuit_plan

        return circuit_plan(model, loc, top, across_models=across)
    if kind == "head" and getattr(loc, "units_", None) is not None:
        from capinterp.cards.heads import head_keys

        return Plan("head", *head_keys(model, loc.units_, top, source=f"fitted {type(loc).__name__}"))
    if kind == "expert" and getattr(loc, "units_", None) is not None:
        from capinterp.cards.experts import expert_plan

        return expert_plan(model, loc.units_, top, source=f"fitted {type(loc).__name__}", across_models=across)
    if kind in PLANNED or kind not in ("neuron", "layer", "head", "expert"):
        raise _planned(kind)
    units = getattr(loc, "units_", None)
    if units is None:
        raise ValueError(f"{type(loc).__name__} is not fitted yet: call .fit(data) first, then describe it")
    source = f"fitted {type(loc).__name__}"
    if kind == "neuron":
        units.check_model(model, across_models=across)
        keys = list(units)
        scores = _neuron_scores(loc.scores_, keys) if getattr(loc, "scores_", None) is not None else None
    else:
        units.check_model(model, across_models=across)
        keys = sorted(units.keys())
        ls = getattr(loc, "layer_scores_", None)
        scores = {k: float(ls[k]) for k in keys} if ls is not None else None
    if not keys:
        raise ValueError(f"the {source} located no units: nothing to describe")
    return Plan(kind, _ranked(keys, scores, top), scores, len(keys), source)


def resolve_units(model: Any, units: Any, top: int, *, across_models: bool = False) -> Plan:
    """The :class:`Plan` for ``units``: a NeuronSet (every neuron, by (layer, neuron), at most
    ``top``), NeuronScores (its ``top`` highest scores), a layer KeySet (every layer), or a fitted
    localizer (its ``units_`` ranked by its ``scores_`` / ``layer_scores_``), an expert or head KeySet,
    a head score array, or a circuit / edge / node set. ValueError for an empty set or one made for
    another model (``across_models``: as in ``check_model``), TypeError for anything else."""
    from capinterp.localizers.base import Localizer

    across = across_models
    if isinstance(units, Localizer):
        return _from_localizer(model, units, top, across_models)
    from capinterp.cards.circuits import circuit_plan, is_circuit

    if is_circuit(units):  # a Circuit, an edge or node KeySet
        return circuit_plan(model, units, top, across_models=across)
    if isinstance(units, NeuronScores):
        units.check_model(model, across_models=across)
        n_real = int(units.valid.sum())
        chosen = list(units.top_k(min(top, n_real)))
        scores = _neuron_scores(units, chosen)
        return Plan("neuron", _ranked(chosen, scores, top), scores, n_real, "NeuronScores (top by score)")
    if isinstance(units, NeuronSet):
        units.check_model(model, across_models=across)
        keys = list(units)
        if not keys:
            raise ValueError("the NeuronSet is empty: nothing to describe")
        return Plan("neuron", _ranked(keys, None, top), None, len(keys), "NeuronSet")
    if (isinstance(units, KeySet) and units.kind == "head") or getattr(units, "ndim", None) == 2:
        from capinterp.cards.heads import head_keys  # a head KeySet, or head scores [n_layers, n_heads]

        if isinstance(units, KeySet):
            units.check_model(model, across_models=across)
        return Plan("head", *head_keys(model, units, top))
    if isinstance(units, KeySet) and units.kind == "expert":
        from capinterp.cards.experts import expert_plan

        return expert_plan(model, units, top, across_models=across)
    if isinstance(units, KeySet):
        if units.kind != "layer":
            raise _planned(units.kind)
        units.check_model(model, across_models=across)
        if not units.keys():
            raise ValueError("the layer KeySet is empty: nothing to describe")
        keys = sorted(units.keys())
        return Plan("layer", keys[:top], None, len(keys), "layer KeySet")
    kind = getattr(units, "kind", None)
    if isinstance(kind, str) and kind in PLANNED:  # a Circuit / EdgeSet that is no KeySet
        raise _planned(kind)
    raise TypeError(
        f"units must be a NeuronSet, NeuronScores, a layer KeySet or a fitted localizer, got {type(units).__name__}"
    )


def builtin_texts() -> list[str]:
    """The package's own text: each built-in fact as a sentence (prompt and answer)."""
    from capinterp.data.builtin import builtin_facts

    return [f"{e.prompt}{e.target}" for e in builtin_facts()]


def read_texts(path: str | os.PathLike) -> list[str]:
    """Texts from a file: ``.txt`` (blank-line-separated paragraphs) or ``.jsonl`` (each line a JSON
    string or an object with a ``text`` field). FileNotFoundError / ValueError naming the problem."""
    p = Path(path).expanduser()
    if p.suffix.lower() not in TEXT_SUFFIXES:
        raise ValueError(f"texts file {str(path)!r}: give a .txt or .jsonl file")
    if not p.is_file():
        raise FileNotFoundError(f"texts file {str(path)!r} not found")
    raw = p.read_text(encoding="utf-8")
    if p.suffix.lower() == ".txt":
        return [" ".join(par.split()) for par in raw.split("\n\n") if par.strip()]
    out = []
    for i, line in enumerate(raw.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{p}:{i}: not JSON ({err.msg})") from None
        text = rec.get("text") if isinstance(rec, dict) else rec
        if not isinstance(text, str):
            raise ValueError(f"{p}:{i}: each line must be a JSON string or an object with a string 'text' field")
        out.append(text)
    return out


def resolve_texts(texts: Any, examples: list[Example] | None) -> tuple[list[str], str]:
    """The corpus and a phrase naming it. ``texts=None``: the task's prompts (if any) and the local
    text of the data folder (:func:`capinterp.data.local_texts`, ``CAPINTERP_DATA``) or, without
    one, the built-in text (:func:`builtin_texts`)."""
    if texts is None:
        from capinterp.data.corpus import local_texts

        prompts = [e.prompt for e in examples or []]
        try:
            extra, where = local_texts(), "local texts of the data folder (CAPINTERP_DATA)"
        except (FileNotFoundError, ValueError):
            extra, where = builtin_texts(), "built-in text (capinterp's fact sentences)"
        return prompts + extra, (f"{len(prompts)} task prompts + " if prompts else "") + f"{len(extra)} {where}"
    if isinstance(texts, (str, os.PathLike)):
        if isinstance(texts, str) and not texts.lower().endswith(TEXT_SUFFIXES):
            raise TypeError(
                "texts must be a list of strings or the path of a .txt / .jsonl file; for one text pass [text]"
            )
        found = read_texts(texts)
        source = f"file {os.fspath(texts)}"
    elif isinstance(texts, (list, tuple)):
        bad = [type(t).__name__ for t in texts if not isinstance(t, str)]
        if bad:
            raise TypeError(f"texts must be strings; got {bad[0]} among them")
        found, source = list(texts), "texts given"
    else:
        raise TypeError(f"texts must be a list of strings, a .txt / .jsonl path or None, got {type(texts).__name__}")
    found = [t for t in found if t.strip()]
    if not found:
        raise ValueError(f"texts ({source}) holds no non-empty text: nothing to read contexts from")
    return found, source
