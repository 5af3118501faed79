"""Compositional arithmetic set of the DCSN paper (Table 1, Appendix A), generated here.

``arithmetic(ops, n, fmt, lang, seed)`` returns ``list[Example]``; prompt layout, letters and
Yes/No labels are described in :mod:`capinterp.data.templates`. Generation choices:

* operands have ``digits`` digits (1 digit: 0-9; for a range, a digit count is drawn uniformly,
  then a value); answers are exact (ints / ``Fraction``, * and / before + and -), and every
  division leaves no remainder at its step: a division whose left operand starts a term is
  built as ``a = b*q`` (b nonzero, a with the requested digits), otherwise the divisor is drawn
  among the operand values that divide the running product (for 4+ digits: among the term's
  factors and random draws, so e.g. ``a*b/a`` is common; with 2+ digits quotients are small);
* 1-OP sets split ``n`` over the operators round-robin (remainder to the first ones); k-OP sets
  deal operators from reshuffled decks, so every op occurs equally often (+-1) and an
  expression's ops are distinct when k <= len(ops); their order is random;
* MQ correct positions and TF truths are exactly balanced (+-1); distractors and wrong shown
  values lie within +-10 of the answer (non-negative when it is) or, half the time, one is a
  plausible error (precedence ignored, or one operator swapped);
* the same seed gives the same expressions in every format and language (zh translates en);
  shots come from a separate seeded RNG and never repeat the query's expression.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from capinterp.core import validate
from capinterp.core.example import Example

from .parsing import join_expression as _join
from .parsing import value_of as _value
from .templates import COMPACT_SEPARATOR, FORMATS, LANGS, SHOT_SEPARATOR, balanced, fewshot, render

__all__ = ["MAX_N_OPS", "OPERATORS", "STYLES", "arithmetic", "arithmetic_suite", "describe"]

OPERATORS = "+-*/"
STYLES: tuple[str, ...] = ("compact", "fewshot", "zeroshot")
MAX_N_OPS = 5
_MAX_TRIES = 500  # attempts per example before giving up with a ValueError
_ENUM_LIMIT = 1000  # enumerate divisor candidates when the operand range is this small


class _Numbers:
    """Draw operands with a given digit range from one seeded RNG."""

    def __init__(self, rng: random.Random, lo: int, hi: int) -> None:
        self.rng = rng
        self.ranges = [(0 if d == 1 else 10 ** (d - 1), 10**d - 1) for d in range(lo, hi + 1)]
        self.size = sum(b - a + 1 for a, b in self.ranges)

    def draw(self, nonzero: bool = False) -> int:
        a, b = self.rng.choice(self.ranges)
        return self.rng.randint(max(a, 1) if nonzero else a, b)

    def multiple_of(self, d: int) -> int | None:
        a, b = self.rng.choice(self.ranges)
        q_lo, q_hi = -(-a // d), b // d
        return d * self.rng.randint(q_lo, q_hi) if q_lo <= q_hi else None

    def divisor_of(self, v: int, factors: Sequence[int]) -> int | None:
        """A nonzero operand value dividing ``v``; ``factors`` (in range) are tried on big ranges."""
        if self.size <= _ENUM_LIMIT:
            cands = [d for a, b in self.ranges for d in range(max(a, 1), b + 1) if v % d == 0]
        else:
            tries = [self.draw(nonzero=True) for _ in range(64)]
            cands = sorted({d for d in [*factors, *tries] if d and v % d == 0})
        return self.rng.choice(cands) if cands else None


def _operands(ops_seq: Sequence[str], nums: _Numbers) -> list[int] | None:
    """Operands for ``ops_seq`` such that every division is exact, or None to retry."""
    xs = [nums.draw() for _ in range(len(ops_seq) + 1)]
    term, factors = xs[0], [xs[0]]  # factors: operands multiplied into the current term
    for j, op in enumerate(ops_seq):
        if op in "+-":
            term, factors = xs[j + 1], [xs[j + 1]]
        elif op == "*":
            term *= xs[j + 1]
            factors.append(xs[j + 1])
        else:
            d: int | None
            if j == 0 or ops_seq[j - 1] in "+-":  # left operand starts a term: a = d*q
                d = nums.draw(nonzero=True)
                a = nums.multiple_of(d)
                if a is None:
                    return None
                xs[j] = term = a
            else:
                d = nums.divisor_of(term, factors)
                if d is None:
                    return None
            xs[j + 1] = d
            term //= d
    return xs


def _op_draws(ops: list[str], n: int, n_ops: int, rng: random.Random) -> list[list[str]]:
    """The operator multiset of each example: round-robin (1-OP) or dealt from decks (k-OP)."""
    if n_ops == 1:
        return [[ops[i % len(ops)]] for i in range(n)]
    deck: list[str] = []
    draws: list[list[str]] = []
    for _ in range(n):
        draw: list[str] = []
        while len(draw) < n_ops:
            if not deck:
                fresh = rng.sample(ops, len(ops))
                deck = [o for o in fresh if o not in draw] + [o for o in fresh if o in draw]
            draw.append(deck.pop(0))
        draws.append(draw)
    return draws


def _validate(
    ops: Any, n: Any, fmt: Any, lang: Any, n_ops: Any, digits: Any, style: Any, shots: Any, tf_labels: Any
) -> tuple[list[str], str, str, int, int]:
    """Check every argument; return (ops, fmt, lang, lo digits, hi digits)."""
    validate.positive_int("n", n)
    if not isinstance(ops, (str, list, tuple)):
        raise ValueError(f"ops must be a string like '+-*/' or a list of operators, got {ops!r}")
    if len(ops) == 0:
        raise ValueError(f"ops is empty; give one or more of {OPERATORS!r}")
    bad = [o for o in ops if not (isinstance(o, str) and len(o) == 1 and o in OPERATORS)]
    if bad:
        raise ValueError(f"unknown op(s) {bad!r}; valid operators are {OPERATORS!r}")
    fmt_u = fmt.upper() if isinstance(fmt, str) else fmt
    if fmt_u not in FORMATS:
        raise ValueError(f"unknown fmt {fmt!r}; valid formats are {', '.join(FORMATS)}")
    lang_l = lang.lower() if isinstance(lang, str) else lang
    if lang_l not in LANGS:
        raise ValueError(f"unknown lang {lang!r}; valid languages are {', '.join(LANGS)}")
    if isinstance(n_ops, bool) or not isinstance(n_ops, int) or not 1 <= n_ops <= MAX_N_OPS:
        raise ValueError(f"n_ops must be an int in 1..{MAX_N_OPS}, got {n_ops!r}")
    lo, hi = (
        (digits, digits)
        if isinstance(digits, int) and not isinstance(digits, bool)
        else (tuple(digits) if isinstance(digits, (tuple, list)) and len(digits) == 2 else (None, None))
    )
    if not all(isinstance(d, int) and not isinstance(d, bool) for d in (lo, hi)) or lo < 1 or lo > hi:
        raise ValueError(f"digits must be an int >= 1 or a (lo, hi) pair, 1 <= lo <= hi; got {digits!r}")
    if style not in STYLES:
        raise ValueError(f"unknown style {style!r}; valid styles are {', '.join(STYLES)}")
    if style == "compact" and fmt_u == "DG" and lang_l != "en":
        raise ValueError(
            f"compact DG prompts ('3+4=') have no words, so lang={lang!r} would give the same "
            "prompts as 'en'; pass style='fewshot' or 'zeroshot' for a translated prompt"
        )
    validate.nonneg_int("shots", shots)
    if (
        len(tf_labels) != 2
        or tf_labels[0] == tf_labels[1]
        or not all(isinstance(s, str) and s and s == s.strip() for s in tf_labels)
    ):
        raise ValueError(f"tf_labels must be two distinct non-empty unpadded strings, got {tf_labels!r}")
    return list(dict.fromkeys(ops)), fmt_u, lang_l, lo, hi


def arithmetic(
    ops: str | Sequence[str] = "+",
    n: int = 200,
    fmt: str = "DG",
    lang: str = "en",
    seed: int = 0,
    *,
    n_ops: int = 1,
    digits: int | tuple[int, int] = 1,
    allow_negative: bool = False,
    style: str = "compact",
    shots: int = 4,
    tf_labels: tuple[str, str] = ("Yes", "No"),
    unique: bool = False,
) -> list[Example]:
    """Generate ``n`` seeded arithmetic examples; every bad argument raises ValueError first.

    ``ops``: operator chars from "+-*/" (string or list); ``n_ops``: operators per expression
    (1..5); ``fmt``: DG/MQ/TF; ``lang``: en/zh; ``digits``: int or (lo, hi); ``style``:
    "compact" (one line per item, ``shots`` solved lines first: ``"3+4=7\n5*2="``; a DG prompt
    then has no words, so it needs ``lang="en"``), "fewshot" (the paper's templates, ``shots``
    solved examples first) or "zeroshot"; ``tf_labels``: TF targets
    (true, false). ``allow_negative=False``: a 1-OP "-" puts the larger operand first, other
    sets redraw. ``unique`` forbids repeated expressions. Raises ValueError when no valid
    expression turns up in ``_MAX_TRIES`` attempts (e.g. "/" chains of 2-digit operands).
    """
    ops_l, fmt, lang, lo, hi = _validate(ops, n, fmt, lang, n_ops, digits, style, shots, tf_labels)
    spec = f"capinterp-arith|{seed}|{''.join(ops_l)}|{n_ops}|{lo}-{hi}|{allow_negative}"
    rng, frng, srng = (random.Random(f"{spec}{tag}") for tag in ("", f"|{fmt}", f"|{fmt}|shots"))
    nums, snums = _Numbers(rng, lo, hi), _Numbers(srng, lo, hi)
    n_shots = 0 if style == "zeroshot" else shots
    tlang = f"{lang}-compact" if style == "compact" else lang
    sep = COMPACT_SEPARATOR if style == "compact" else SHOT_SEPARATOR
    slots = balanced(frng, n, 4 if fmt == "MQ" else 2)
    digits_meta: Any = lo if lo == hi else [lo, hi]
    labels = (tf_labels[0], tf_labels[1])

    def build(
        draw: Sequence[str], r: random.Random, num: _Numbers, avoid: set[str]
    ) -> tuple[str, int, list[str], list[int]]:
        """A valid expression from the ops in ``draw`` (in random order) not in ``avoid``."""
        for _ in range(_MAX_TRIES):
            seq = r.sample(list(draw), len(draw))
            xs = _operands(seq, num)
            if xs is None:
                continue
            if not allow_negative and n_ops == 1 and seq == ["-"] and xs[0] < xs[1]:
                xs.reverse()
            expr = _join(xs, seq)
            value = _value(xs, seq)
            if value.denominator != 1 or expr in avoid or (value < 0 and not allow_negative):
                continue
            return expr, int(value), seq, xs
        raise ValueError(
            f"could not generate a valid expression for ops {''.join(draw)!r} with digits={digits!r} "
            f"after {_MAX_TRIES} tries (exact division, allow_negative={allow_negative}, "
            f"unique={unique}); relax the constraints"
        )

    out: list[Example] = []
    seen: set[str] = set()
    for i, draw in enumerate(_op_draws(ops_l, n, n_ops, rng)):
        expr, answer, seq, xs = build(draw, rng, nums, seen if unique else set())
        seen.add(expr)
        query, target, extra = render(fmt, tlang, seq, xs, answer, slots[i], frng, labels)
        solved: list[tuple[str, str]] = []
        shot_exprs: list[str] = []
        shot_slots = balanced(srng, n_shots, 4 if fmt == "MQ" else 2)
        for s in range(n_shots):
            sdraw = [srng.choice(ops_l)] if n_ops == 1 else _op_draws(ops_l, 1, n_ops, srng)[0]
            sexpr, sans, sseq, sxs = build(sdraw, srng, snums, {expr, *shot_exprs})
            sq, st, _ = render(fmt, tlang, sseq, sxs, sans, shot_slots[s], srng, labels)
            solved.append((sq, st))
            shot_exprs.append(sexpr)
        meta = {
            "task": "arithmetic",
            "ops": seq,
            "op_set": sorted(set(seq)),
            "ops_spec": "".join(ops_l),
            "n_ops": n_ops,
            "fmt": fmt,
            "lang": lang,
            "answer": answer,
            "expression": expr,
            "digits": digits_meta,
            "allow_negative": allow_negative,
            "style": style,
            "shots": n_shots,
            "shot_expressions": shot_exprs,
            "seed": seed,
            "index": i,
            **extra,
        }
        out.append(Example(fewshot(query, solved, sep), target, meta))
    return out


def arithmetic_suite(
    ops: str | Sequence[str] = "+-*/",
    fmts: Sequence[str] = FORMATS,
    langs: Sequence[str] = LANGS,
    n: int = 1000,
    seed: int = 0,
    **kwargs: Any,
) -> dict[tuple[str, str, str], list[Example]]:
    """One 1-OP set per (operator, format, language), as in the paper's neuron-identification part.

    Extra keyword arguments go to :func:`arithmetic`. Within an operator, the same seed gives
    the same expressions across formats and languages.
    """
    if isinstance(fmts, str) or isinstance(langs, str):
        raise ValueError("fmts and langs must be sequences, e.g. ('DG', 'MQ') and ('en',)")
    rest = [
        kwargs.get(k, d)
        for k, d in (("n_ops", 1), ("digits", 1), ("style", "compact"), ("shots", 4), ("tf_labels", ("Yes", "No")))
    ]
    for f, lg in [(f, "en") for f in fmts] + [(f, lg) for f in fmts for lg in langs]:  # unknown names first
        _validate(ops, n, f, lg, *rest)
    return {
        (op, f, lg): arithmetic(op, n, f, lg, seed, **kwargs) for op in dict.fromkeys(ops) for f in fmts for lg in langs
    }


def describe(ds: Sequence[Example]) -> str:
    """Short description of a dataset, for result metadata.

    E.g. ``arithmetic ops=+ fmt=DG lang=en n=200 digits=1 seed=0 n_ops=1 style=fewshot shots=4``;
    fields that vary within ``ds`` list their values joined by commas.
    """
    if not ds:
        return "empty dataset n=0"
    if any(e.meta.get("task") != "arithmetic" for e in ds):
        return f"dataset n={len(ds)}"

    def field(key: str) -> str:
        vals = list(dict.fromkeys(str(e.meta[key]).replace(" ", "") for e in ds))
        return ",".join(vals)

    head = f"arithmetic ops={field('ops_spec')} fmt={field('fmt')} lang={field('lang')} n={len(ds)}"
    return (
        f"{head} digits={field('digits')} seed={field('seed')} n_ops={field('n_ops')} "
        f"style={field('style')} shots={field('shots')}"
    )
