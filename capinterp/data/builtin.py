"""Built-in facts (written for this package) and filtering facts by what a model knows."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from capinterp.core.example import Example
from capinterp.core.protocol import Model

__all__ = ["builtin_facts", "facts_known_by"]

# ----------------------------------------------------------------------------- built-in facts

# (prompt, object, subject, relation): written for capinterp; subjects occur verbatim in prompts.
_BUILTIN = [
    ("The Eiffel Tower is located in the city of", "Paris", "Eiffel Tower", "located_in_city"),
    ("The Colosseum is located in the city of", "Rome", "Colosseum", "located_in_city"),
    ("Big Ben is located in the city of", "London", "Big Ben", "located_in_city"),
    ("The Statue of Liberty is located in the city of", "New", "Statue of Liberty", "located_in_city"),
    ("The Great Wall is located in the country of", "China", "Great Wall", "located_in_country"),
    ("The Taj Mahal is located in the country of", "India", "Taj Mahal", "located_in_country"),
    ("Mount Everest is located in the continent of", "Asia", "Mount Everest", "located_in_continent"),
    ("The capital of Japan is", "Tokyo", "Japan", "capital"),
    ("The capital of Italy is", "Rome", "Italy", "capital"),
    ("The official language of France is", "French", "France", "official_language"),
    ("Microsoft was founded by Bill", "Gates", "Microsoft", "founded_by"),
    ("Romeo and Juliet was written by William", "Shakespeare", "Romeo and Juliet", "author"),
    ("The currency of Japan is the", "yen", "Japan", "currency"),
    ("Albert Einstein was born in the country of", "Germany", "Albert Einstein", "born_in_country"),
]


def builtin_facts(n: int | None = None) -> list[Example]:
    """About a dozen famous facts (written for this package) with ``meta["subject"]``.

    Targets carry the leading space (``" Paris"``); multi-word objects are cut to the first
    word so that the target is what the model says next. Not every model knows every fact:
    filter with :func:`facts_known_by`.
    """
    rows = _BUILTIN if n is None else _BUILTIN[:n]
    return [
        Example(p, " " + o, {"subject": s, "object": o, "relation": rel, "source": "builtin", "fact_id": i})
        for i, (p, o, s, rel) in enumerate(rows)
    ]


# ----------------------------------------------------------------------------- filtering


@torch.no_grad()
def facts_known_by(
    model: Model,
    facts: Iterable[Example],
    *,
    batch_size: int = 64,
    on_mismatch: str = "error",
    return_predictions: bool = False,
) -> list[Example] | tuple[list[Example], list[int]]:
    """Keep the facts whose greedy next token (after the prompt) is the target's first token.

    Targets are tokenized in context (:func:`capinterp.core.tokens.encode`); a target that cannot follow
    its prompt as separate tokens raises :class:`~capinterp.core.tokens.TokenizationError` (or is
    dropped with ``on_mismatch="skip"``). Prompts run right-padded in batches of ``batch_size``
    (one forward per batch; only each row's last prompt position is unembedded).
    ``return_predictions=True`` also returns the predicted first token id of every kept-or-not
    encoded fact, in input order.
    """
    from capinterp.arch.forward import logits_at
    from capinterp.core.tokens import batches, collate, encode, pad_id

    facts = list(facts)
    if not facts:
        raise ValueError("facts_known_by needs at least one fact")
    enc = encode(model, facts, on_mismatch=on_mismatch, max_target_tokens=1)
    kept: list[Example] = []
    preds: list[int] = []
    dev = model.cfg.device
    pid = pad_id(model.tokenizer)
    for chunk in batches(enc, batch_size):
        b = collate(chunk, pid, with_target=False, device=dev)
        nxt = logits_at(model, b.tokens, b.lengths - 1).argmax(-1).tolist()
        for it, p in zip(chunk, nxt):
            preds.append(int(p))
            if int(p) == it.target_ids[0]:
                kept.append(it.example)
    return (kept, preds) if return_predictions else kept
