"""Corrupted prompts for activation patching: another example of the task with the same token length.

The RelP and AtP* papers patch a unit with its value on a corrupted prompt (clean -> corrupted, at
every position). For facts and arithmetic the corrupted prompt here is another example of the same
task (another fact, another problem) whose prompt has the same number of tokens, so positions line
up; one with a different answer is preferred. :func:`partner_pairs` returns the
:class:`~capinterp.circuits.eap.Pair` list the patching functions take, and refuses, naming the
example, when one has no partner of its length.
"""

from __future__ import annotations

import random
from typing import Any

from capinterp.circuits.eap import Pair, make_pairs
from capinterp.core import validate
from capinterp.core.example import Example
from capinterp.core.protocol import Model
from capinterp.core.tokens import encode

__all__ = ["partner_fn", "partner_pairs", "partnered", "partners"]


def partners(model: Model, data: Any, pool: Any = None, *, seed: int = 0) -> list[Example | None]:
    """Per example of ``data``: another example of ``pool`` (default ``data``) whose prompt has the
    same token count, a different answer where one exists; None where there is none."""
    data = validate.examples(data, need_target=True)
    pool = data if pool is None else validate.examples(pool, "pool", need_target=True)
    by_len: dict[int, list[tuple[Example, int]]] = {}
    for it in encode(model, pool):
        by_len.setdefault(len(it.prompt_ids), []).append((it.example, it.target_ids[0]))
    rng = random.Random(seed)
    out: list[Example | None] = []
    for it in encode(model, data):
        same = [(e, t) for e, t in by_len.get(len(it.prompt_ids), []) if e.prompt != it.example.prompt]
        rng.shuffle(same)
        other = [e for e, t in same if t != it.target_ids[0]]
        out.append(other[0] if other else same[0][0] if same else None)
    return out


def partnered(model: Model, data: Any, pool: Any = None, *, seed: int = 0) -> list[Example]:
    """The examples of ``data`` that have a partner (:func:`partners`), order kept."""
    data = validate.examples(data, need_target=True)
    return [e for e, p in zip(data, partners(model, data, pool, seed=seed)) if p is not None]


def partner_pairs(model: Model, data: Any, pool: Any = None, *, seed: int = 0) -> list[Pair]:
    """Clean/corrupted pairs, each example's corrupted prompt being its partner's (:func:`partners`);
    ValueError naming the first example without one."""
    data = validate.examples(data, need_target=True)
    found = partners(model, data, pool, seed=seed)
    missing = [e for e, p in zip(data, found) if p is None]
    if missing:
        raise ValueError(
            f"{len(missing)} of {len(data)} examples have no corrupted partner: no other example of the same "
            f"prompt token length (first: {missing[0].prompt!r}); pass a larger pool= or leave them out (partnered)"
        )
    return make_pairs(model, data, corrupt=partner_fn(data, found))


def partner_fn(data: list[Example], found: list[Example | None]) -> Any:
    """The ``corrupt=`` callable of :func:`~capinterp.circuits.eap.make_pairs` and
    :func:`~capinterp.interventions.faithfulness.ablated_metric`: an example -> its partner."""
    table = {(e.prompt, e.target): p for e, p in zip(data, found)}
    return lambda ex: table[ex.prompt, ex.target]
