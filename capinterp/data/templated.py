"""Small templated task sets written for this package (no data folder needed).

* :func:`word_problem_keys` / :func:`render_word_problem` -- one-step arithmetic word problems
  ("Mia has 7 pencils. She buys 2 more pencils. How many pencils does she have now?");
  the answer is a number in 0..81.
* :func:`sentiment_keys` / :func:`render_sentiment` -- one- or two-clause reviews with a clear
  polarity ("The plot was dull and the acting was clumsy.") labelled positive / negative.

Each set is a finite pool of hashable *keys* (cheap tuples, enumerated once); callers split and
sample keys, then render only the ones they keep. Keys are stable across versions of this file
as long as the word lists below only grow at their ends.
"""

from __future__ import annotations

from functools import cache

__all__ = [
    "EMOTION_SHOTS",
    "SENTIMENT_SHOTS",
    "render_sentiment",
    "render_word_problem",
    "sentiment_keys",
    "word_problem_keys",
]

# ----------------------------------------------------------------------------- word problems

_NAMES = (("Mia", "she"), ("Tom", "he"), ("Sara", "she"), ("Ben", "he"), ("Lena", "she"), ("Omar", "he"))
_OBJECTS = ("apples", "pencils", "stickers", "marbles", "books", "cookies")

# op -> templates; {n} name, {p} pronoun, {P} capitalised pronoun, {o} object, {a} {b} numbers.
_WORD_TEMPLATES: dict[str, tuple[str, ...]] = {
    "+": (
        "{n} has {a} {o}. {P} buys {b} more {o}. How many {o} does {p} have now?",
        "{n} had {a} {o} and a friend gave {pp} {b} {o}. How many {o} does {n} have in total?",
    ),
    "-": (
        "{n} has {a} {o}. {P} gives away {b} {o}. How many {o} are left?",
        "{n} had {a} {o} and lost {b} of them. How many {o} does {n} have now?",
    ),
    "*": (
        "{n} has {a} boxes with {b} {o} in each box. How many {o} does {n} have?",
        "{n} buys {a} bags of {o}. Each bag holds {b} {o}. How many {o} did {p} buy?",
    ),
    "/": (
        "{n} shares {a} {o} equally among {b} friends. How many {o} does each friend get?",
        "{n} puts {a} {o} into {b} equal piles. How many {o} are in each pile?",
    ),
}


def _operand_pairs(op: str) -> list[tuple[int, int]]:
    if op == "+":
        return [(a, b) for a in range(1, 10) for b in range(1, 10)]
    if op == "-":
        return [(a, b) for a in range(2, 10) for b in range(1, a)]
    if op == "*":
        return [(a, b) for a in range(2, 10) for b in range(2, 10)]
    return [(b * q, b) for b in range(2, 10) for q in range(1, 10)]


@cache
def word_problem_keys() -> tuple[tuple[str, int, int, int, int, int], ...]:
    """Every problem as ``(op, template, name, object, a, b)``: 6*6*2*(81+36+64+72) = 18,216 keys."""
    return tuple(
        (op, t, ni, oi, a, b)
        for op, temps in _WORD_TEMPLATES.items()
        for t in range(len(temps))
        for ni in range(len(_NAMES))
        for oi in range(len(_OBJECTS))
        for a, b in _operand_pairs(op)
    )


def render_word_problem(key: tuple[str, int, int, int, int, int]) -> tuple[str, int]:
    """``(question, answer)`` of one key from :func:`word_problem_keys`."""
    op, t, ni, oi, a, b = key
    name, pron = _NAMES[ni]
    obj_pron = "her" if pron == "she" else "him"
    text = _WORD_TEMPLATES[op][t].format(n=name, p=pron, P=pron.capitalize(), pp=obj_pron, o=_OBJECTS[oi], a=a, b=b)
    answer = {"+": a + b, "-": a - b, "*": a * b, "/": a // b if b else 0}[op]
    return text, answer


# ----------------------------------------------------------------------------- sentiment

_THINGS = ("movie", "film", "plot", "acting", "story", "ending", "soundtrack", "dialogue")
_POSITIVE = ("wonderful", "brilliant", "delightful", "excellent", "charming", "superb", "moving", "great")
_NEGATIVE = ("boring", "dreadful", "awful", "dull", "terrible", "disappointing", "tedious", "clumsy")
_SENT_TEMPLATES = (
    "The {t} was {a}.",
    "I thought the {t} was {a}.",
    "Honestly, the {t} was {a}.",
    "The {t} was {a} and the {t2} was {a2}.",
    "What {art} {a} {t}, and the {t2} was {a2} too.",
)

#: Two solved reviews (written for this package) put before every sentiment query.
SENTIMENT_SHOTS = (
    ("I loved every minute of it, a real joy to watch.", "positive"),
    ("A waste of two hours, I nearly fell asleep.", "negative"),
)


#: Two solved texts (written for this package) put before every Emotion query.
EMOTION_SHOTS = (
    ("i finally got the job and i cannot stop smiling", "joy"),
    ("i miss my grandmother so much these days", "sadness"),
)


@cache
def sentiment_keys() -> tuple[tuple[int, int, int, int, int, int], ...]:
    """Every review as ``(label, template, thing, adjective, thing2, adjective2)``; label 1 = positive.

    One-clause templates ignore the second pair (it is fixed to 0 there, so each review is one key);
    two-clause templates use two different things.
    """
    keys = []
    n_adj = len(_POSITIVE)
    for label in (1, 0):
        for t, tpl in enumerate(_SENT_TEMPLATES):
            two = "{t2}" in tpl
            for ti in range(len(_THINGS)):
                for ai in range(n_adj):
                    if not two:
                        keys.append((label, t, ti, ai, 0, 0))
                        continue
                    for t2 in range(len(_THINGS)):
                        if t2 != ti:
                            keys.append((label, t, ti, ai, t2, (ai + 1 + t2) % n_adj))
    return tuple(keys)


def render_sentiment(key: tuple[int, int, int, int, int, int]) -> tuple[str, str]:
    """``(review text, "positive" | "negative")`` of one key from :func:`sentiment_keys`."""
    label, t, ti, ai, t2, a2 = key
    adjs = _POSITIVE if label == 1 else _NEGATIVE
    art = "an" if adjs[ai][0] in "aeiou" else "a"
    text = _SENT_TEMPLATES[t].format(t=_THINGS[ti], a=adjs[ai], art=art, t2=_THINGS[t2], a2=adjs[a2])
    return text[0].upper() + text[1:], "positive" if label == 1 else "negative"
