"""Prompt templates for the compositional arithmetic set (DCSN paper, Table 1 / Appendix A).

Layout: English templates are the paper's, word for word, except that option letters are upper
case (``(A) 10`` -> target ``"A"``); the Chinese ones are our translation. Every template ends
with a colon (``:``, or full-width ``：`` in Chinese) and the answer follows it directly, with
no space: ``...please provide the answer directly:16``. Targets: DG the integer (``"-3"``),
MQ a letter ``A``-``D``, TF ``Yes``/``No`` in both languages (digits, letters and Yes/No are then
the same tokens in en and zh; ``arithmetic(tf_labels=("是", "否"))`` switches). A few-shot
prompt is the solved shots (question + answer, glued the same way) and then the bare query,
joined by a blank line (:data:`SHOT_SEPARATOR`). ``style="compact"`` uses one-line
templates (``3+4=`` -> ``7``) joined by single newlines: measured on the packaged models it is
the layout that gives them real accuracy (docs/models.md), so it is the default. :func:`render` also draws MQ distractors and
TF wrong values (near the answer, or a plausible error).

Tokenizer note: Gemma 3 and SmolLM2 have a ``:-`` token, so a negative English DG answer glued
to the colon tokenizes as ``:-``, ``3`` inside shots but as ``:`` + ``-``, ``3`` for the query;
use ``allow_negative=False`` where that matters. Every other case splits at the prompt's end.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

from .parsing import join_expression, value_of

__all__ = [
    "COMPACT_SEPARATOR",
    "FORMATS",
    "LANGS",
    "LETTERS",
    "SHOT_SEPARATOR",
    "balanced",
    "fewshot",
    "format_options",
    "question",
    "render",
]

FORMATS: tuple[str, ...] = ("DG", "MQ", "TF")
LANGS: tuple[str, ...] = ("en", "zh")
LETTERS: tuple[str, ...] = ("A", "B", "C", "D")
SHOT_SEPARATOR = "\n\n"

_TEMPLATES: dict[str, dict[str, str]] = {
    "en": {
        "DG": 'Based on the given expression "{expr}=?", please provide the answer directly:',
        "MQ": (
            'Based on the given expression "{expr}=?", the following options are provided: '
            "{options}. Please select the correct option:"
        ),
        "TF": ('Based on the given expression "{expr}={shown}", please determine whether it is correct:'),
    },
    "zh": {
        "DG": "根据给定的表达式“{expr}=?”，请直接给出答案：",
        "MQ": "根据给定的表达式“{expr}=?”，提供以下选项：{options}。请选择正确的选项：",
        "TF": "根据给定的表达式“{expr}={shown}”，请判断它是否正确：",
    },
    # style="compact": one line per item, shots joined by a single newline ("3+4=7\n5*2=").
    "en-compact": {
        "DG": "{expr}=",
        "MQ": "{expr}=? {options}. Answer:",
        "TF": "{expr}={shown}. Correct?",
    },
    "zh-compact": {
        "DG": "{expr}=",
        "MQ": "{expr}=? {options}。答案：",
        "TF": "{expr}={shown}。正确吗？",
    },
}
COMPACT_SEPARATOR = "\n"


def format_options(options: Sequence[int], lang: str) -> str:
    """``(A) 10, (B) 0, (C) 16, and (D) 26`` (en) or ``(A) 10、(B) 0、(C) 16 和 (D) 26`` (zh)."""
    if len(options) != len(LETTERS):
        raise ValueError(f"expected {len(LETTERS)} options, got {len(options)}")
    parts = [f"({letter}) {value}" for letter, value in zip(LETTERS, options)]
    if lang.startswith("en"):
        return ", ".join(parts[:-1]) + ", and " + parts[-1]
    return "、".join(parts[:-1]) + " 和 " + parts[-1]


def question(
    fmt: str,
    lang: str,
    expr: str,
    *,
    options: Sequence[int] | None = None,
    shown: int | None = None,
) -> str:
    """Render one bare question; it ends where the answer starts (no trailing whitespace).

    ``options`` is required for MQ (four values in letter order), ``shown`` for TF.
    """
    try:
        template = _TEMPLATES[lang][fmt]
    except KeyError:
        raise ValueError(f"no template for fmt={fmt!r} lang={lang!r}") from None
    if fmt == "MQ":
        if options is None:
            raise ValueError("MQ questions need options")
        return template.format(expr=expr, options=format_options(options, lang))
    if fmt == "TF":
        if shown is None:
            raise ValueError("TF questions need the shown value")
        return template.format(expr=expr, shown=shown)
    return template.format(expr=expr)


def fewshot(query: str, solved: Sequence[tuple[str, str]], sep: str = SHOT_SEPARATOR) -> str:
    """Join solved ``(question, answer)`` shots and the query question with blank lines.

    Each shot is ``question + answer`` exactly as the query is later continued, so the
    model sees the answer layout; with no shots the query is returned unchanged.
    """
    blocks = [q + a for q, a in solved] + [query]
    return sep.join(blocks)


def _plausible(xs: Sequence[int], ops_seq: Sequence[str]) -> list[int]:
    """Typical wrong answers: precedence ignored, or one operator swapped for another."""
    out: set[int | Fraction] = set()
    val = Fraction(xs[0])
    for op, x in zip(ops_seq, xs[1:]):  # left to right, precedence ignored (divisors are nonzero)
        val = val + x if op == "+" else val - x if op == "-" else val * x if op == "*" else val / x
    out.add(val)
    for j in range(len(ops_seq)):
        for alt in "+-*":
            if alt != ops_seq[j]:
                out.add(value_of(xs, [*ops_seq[:j], alt, *ops_seq[j + 1 :]], strict=False))
    return sorted(int(v) for v in out if v.denominator == 1)


def _wrong_values(rng: random.Random, answer: int, k: int, xs: Sequence[int], ops_seq: Sequence[str]) -> list[int]:
    """``k`` distinct wrong values near ``answer`` (non-negative when the answer is).

    Half the time one of them is a plausible error of ``xs`` / ``ops_seq`` (when there is one).
    """

    def ok(v):
        return v != answer and (answer < 0 or v >= 0)

    picks: list[int] = []
    if rng.random() < 0.5:
        errs = [v for v in _plausible(xs, ops_seq) if ok(v) and abs(v - answer) <= 100]
        if errs:
            picks.append(rng.choice(errs))
    near = [answer + d for d in range(-10, 11) if ok(answer + d) and answer + d not in picks]
    return picks + rng.sample(near, k - len(picks))


def render(
    fmt: str,
    lang: str,
    seq: Sequence[str],
    xs: Sequence[int],
    answer: int,
    slot: int,
    rng: random.Random,
    labels: tuple[str, str],
) -> tuple[str, str, dict[str, Any]]:
    """Render the expression ``xs``/``seq`` as a bare question: (question, target, format meta).

    ``slot`` is the MQ correct position (0-3) or the TF truth (1 true, 0 false); ``rng``
    draws the distractors / wrong shown value; ``labels`` are the TF (true, false) targets.
    """
    expr = join_expression(xs, seq)
    if fmt == "DG":
        return question(fmt, lang, expr), str(answer), {}
    if fmt == "MQ":
        options = _wrong_values(rng, answer, 3, xs, seq)
        options.insert(slot, answer)
        q = question(fmt, lang, expr, options=options)
        return q, LETTERS[slot], {"options": options, "correct": LETTERS[slot], "correct_index": slot}
    shown = answer if slot else _wrong_values(rng, answer, 1, xs, seq)[0]
    q = question(fmt, lang, expr, shown=shown)
    meta = {"shown": shown, "truth": bool(slot), "labels": list(labels)}
    return q, labels[0] if slot else labels[1], meta


def balanced(rng: random.Random, n: int, k: int) -> list[int]:
    """``n`` values in ``range(k)``, counts differing by at most one, in random order."""
    vals = [i % k for i in range(n)]
    rng.shuffle(vals)
    return vals
