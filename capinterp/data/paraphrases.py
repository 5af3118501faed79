"""Paraphrase bags of one fact each, for the fidelity and reliability experiments (Huang et al. 2025, Sec. 3.1-3.2).

* :func:`builtin_paraphrases` -- five prompts per built-in fact (:func:`~capinterp.data.builtin_facts`),
  written for this package: the subject occurs verbatim (causal tracing needs it) and every prompt
  ends where the object's first word starts;
* :func:`pararel_paraphrases` -- the knowledge-neurons ParaRel bags read from the shared data folder
  (prompts without a recoverable subject are dropped);
* :func:`known_paraphrases` -- keep the prompts a model answers (greedy next token = target's first
  token) and the bags with enough of them left.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from capinterp.core.example import Example
from capinterp.core.protocol import Model

from .builtin import builtin_facts, facts_known_by

__all__ = ["NoKnownFacts", "builtin_paraphrases", "known_paraphrases", "pararel_paraphrases"]

_LANDMARK = (
    "{s} is located in the city of",
    "{s} can be found in the city of",
    "{s} stands in the city of",
    "Tourists visit {s} in the city of",
    "{s} is a famous landmark in the city of",
)
_COUNTRY_SITE = (
    "{s} is located in the country of",
    "{s} can be found in the country of",
    "{s} stands in the country of",
    "Tourists visit {s} in the country of",
    "{s} is a famous landmark in the country of",
)
_CAPITAL = (
    "The capital of {s} is",
    "The capital city of {s} is",
    "{s}'s capital is",
    "The government of {s} sits in the city of",
    "The largest city and capital of {s} is",
)


def _the(templates: tuple[str, ...]) -> tuple[str, ...]:
    """Put "the" before the subject ("The Eiffel Tower ...", "Tourists visit the Eiffel Tower ...")."""
    return tuple("The " + t if t.startswith("{s}") else t.replace("{s}", "the {s}") for t in templates)


# fact_id of builtin_facts() -> paraphrase templates ({s} = the subject as written in the fact).
_TEMPLATES: dict[int, tuple[str, ...]] = {
    0: _the(_LANDMARK),
    1: _the(_LANDMARK),
    2: _LANDMARK,
    3: (
        "The {s} is located in the city of",
        "The {s} can be found in",
        "The {s} stands in the harbor of",
        "Tourists visit the {s} in",
        "The {s} is a famous landmark in",
    ),
    4: _the(_COUNTRY_SITE),
    5: _the(_COUNTRY_SITE),
    6: (
        "{s} is located in the continent of",
        "{s} can be found on the continent of",
        "The continent where {s} stands is",
        "{s} rises on the continent of",
        "Climbers travel to {s} on the continent of",
    ),
    7: _CAPITAL,
    8: _CAPITAL,
    9: (
        "The official language of {s} is",
        "The language spoken in {s} is",
        "In {s}, most people speak",
        "{s}'s official language is",
        "The main language of {s} is",
    ),
    10: (
        "{s} was founded by Bill",
        "The founder of {s} is Bill",
        "{s} was started by Bill",
        "The company {s} was created by Bill",
        "{s}'s co-founder is Bill",
    ),
    11: (
        "{s} was written by William",
        "The author of {s} is William",
        "The play {s} was written by William",
        "{s} is a play by William",
        "{s} was penned by William",
    ),
    12: (
        "The currency of {s} is the",
        "The money used in {s} is the",
        "In {s}, people pay with the",
        "{s}'s currency is the",
        "The official currency of {s} is the",
    ),
    13: (
        "{s} was born in the country of",
        "The country where {s} was born is",
        "{s}'s country of birth is",
        "{s} came into the world in the country of",
        "The birth country of {s} is",
    ),
}


def builtin_paraphrases(n_facts: int | None = None) -> list[list[Example]]:
    """Five paraphrased prompts for each built-in fact (written for this package), one list per fact.

    Every Example has the fact's target (``" Paris"``) and ``meta``: subject, object, relation,
    fact_id, paraphrase_index, source ``"builtin_paraphrases"``.
    """
    facts = builtin_facts()
    bags = []
    for f in facts[: n_facts if n_facts is not None else len(facts)]:
        fid, subj = f.meta["fact_id"], f.meta["subject"]
        bag = [
            Example(t.format(s=subj), f.target, {**f.meta, "paraphrase_index": j, "source": "builtin_paraphrases"})
            for j, t in enumerate(_TEMPLATES[fid])
        ]
        bags.append(bag)
    return bags


def pararel_paraphrases(n_facts: int, *, path: Any = None, per_fact: int = 5) -> list[list[Example]]:
    """The first ``n_facts`` knowledge-neurons ParaRel bags (``knowledge_neurons/data_11.json``).

    Only prompts whose subject was recovered are kept (causal tracing needs it), at most
    ``per_fact`` per fact; facts left with fewer than two prompts are skipped. ``path`` defaults
    to ``knowledge_neurons/data_11.json`` in the ``CAPINTERP_DATA`` folder; FileNotFoundError when
    neither is there.
    """
    from .capability_sources import data_file
    from .facts import load_pararel_bags

    p = path if path is not None else data_file("knowledge_neurons/data_11.json")
    if p is None:
        raise FileNotFoundError(
            "knowledge_neurons/data_11.json not found: pass path= or set CAPINTERP_DATA to the data folder"
        )
    out = []
    for bag in load_pararel_bags(p, min_prompts=2):
        kept = [e for e in bag if e.meta.get("subject")][:per_fact]
        if len(kept) >= 2:
            out.append(kept)
        if len(out) >= n_facts:
            break
    return out


class NoKnownFacts(ValueError):
    """:func:`known_paraphrases` removed every fact; the message gives the counts at each filter step."""


def known_paraphrases(
    model: Model,
    bags: Sequence[Sequence[Example]],
    *,
    per_fact: int = 5,
    min_prompts: int = 2,
    max_facts: int | None = None,
    allow_empty: bool = False,
) -> list[list[Example]]:
    """Per bag, the first ``per_fact`` prompts the model answers; bags with fewer than ``min_prompts`` are dropped.

    One batched pass over all prompts (:func:`~capinterp.data.facts_known_by`); prompts whose target
    does not tokenize after them are dropped too. Stops after ``max_facts`` bags. When no bag is
    left (e.g. a tiny random model knows no fact), :class:`NoKnownFacts` says how many bags and
    prompts there were and how many each filter removed; ``allow_empty=True`` returns ``[]`` instead.
    """
    flat = [e for bag in bags for e in bag]
    if not flat:
        if allow_empty:
            return []
        raise NoKnownFacts("known_paraphrases: no fact given (0 bags or only empty bags)")
    found: Any = facts_known_by(model, flat, on_mismatch="skip", return_predictions=True)
    kept_facts, preds = found
    known = {id(e) for e in kept_facts}
    out = []
    for bag in bags:
        kept = [e for e in bag if id(e) in known][:per_fact]
        if len(kept) >= min_prompts:
            out.append(kept)
        if max_facts is not None and len(out) >= max_facts:
            break
    if not out and not allow_empty:
        some = sum(any(id(e) in known for e in bag) for bag in bags)
        raise NoKnownFacts(
            f"known_paraphrases removed every fact: of {len(bags)} fact(s) ({len(flat)} prompts), "
            f"{len(flat) - len(preds)} prompt(s) have a target that does not tokenize after them, the model answers "
            f"{len(known)} of the other {len(preds)} (filter facts_known_by: greedy next token = the target's "
            f"first token), and {some} fact(s) keep at least one answered prompt where {min_prompts} are "
            "needed (min_prompts). The model does not know these facts (a tiny random test model knows "
            "none): use a trained model (smollm2, gemma3)."
        )
    return out
