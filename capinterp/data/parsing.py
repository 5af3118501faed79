"""Turn a model's short greedy continuation into a normalized answer, and score it; and
evaluate arithmetic expressions exactly (``evaluate("1+3*5") == Fraction(16)``).

``parse_answer("DG", " -12abc") == "-12"``, ``parse_answer("MQ", "(c) 16") == "C"``,
``parse_answer("TF", "true") == "Yes"``; ``None`` when nothing parseable starts the text.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from fractions import Fraction

from capinterp.core.example import Example, glued_words

__all__ = ["evaluate", "is_correct", "join_expression", "parse_answer", "value_of"]

_TOKEN = re.compile(r"\d+|[-+*/]")

_DG = re.compile(r"\s*([-−]?)\s*(\d+)")
_MQ = re.compile(r"\s*(?:option\s*)?[(\[（]?\s*([A-Da-d])(?![A-Za-z])", re.IGNORECASE)
_TF = re.compile(r"\s*(yes|no|true|false|不正确|不对|不是|正确|错误|是|否|对|错)(?![A-Za-z])", re.IGNORECASE)
_TF_MAP = {
    "yes": "Yes",
    "true": "Yes",
    "正确": "Yes",
    "是": "Yes",
    "对": "Yes",
    "no": "No",
    "false": "No",
    "不正确": "No",
    "不对": "No",
    "不是": "No",
    "错误": "No",
    "否": "No",
    "错": "No",
}


def parse_answer(fmt: str, text: str) -> str | None:
    """Normalized answer at the start of ``text`` (leading whitespace allowed).

    DG: the leading integer as a canonical string ("007" -> "7", "-0" -> "0").
    MQ: the first option letter A-D, upper case ("(a)", "b)", "Option C" are accepted).
    TF: "Yes" or "No" (yes/no, true/false, 是/否, 对/错, 正确/错误, any case).
    """
    if fmt == "DG":
        m = _DG.match(text)
        return str(int(m.group(1).replace("−", "-") + m.group(2))) if m else None
    if fmt == "MQ":
        m = _MQ.match(text)
        return m.group(1).upper() if m else None
    if fmt == "TF":
        m = _TF.match(text)
        return _TF_MAP[m.group(1).lower()] if m else None
    raise ValueError(f"unknown fmt {fmt!r}; valid formats are DG, MQ, TF")


def is_correct(example: Example, text: str) -> bool:
    """Whether the continuation ``text`` answers ``example`` correctly.

    Arithmetic examples (``meta["fmt"]`` set) compare parsed, normalized answers; other
    examples need the stripped continuation to start with the stripped target as whole words:
    ``" Paris."`` answers ``" Paris"``, but ``" Paris"`` does not answer ``" P"`` and ``"12"`` does
    not answer ``"1"`` (the character after the target must not continue its last word). A target
    filled with the model's greedy next token (``meta["target_from"] == "greedy"``) is one token,
    which may start a longer word: there the continuation need only start with it.
    """
    fmt = example.meta.get("fmt")
    if fmt is not None:
        pred = parse_answer(fmt, text)
        return pred is not None and pred == parse_answer(fmt, example.target)
    gold, said = example.target.strip(), text.strip()
    if not gold or not said.startswith(gold):
        return False
    if example.meta.get("target_from") == "greedy":  # the model's own next token: a prefix by design
        return True
    return not glued_words(gold, said[len(gold) :])  # the next character would continue the word


def evaluate(expression: str, strict: bool = True) -> Fraction:
    """Exact value of ``"1+3*5"`` (non-negative integer operands, standard precedence).

    With ``strict`` every division must leave no remainder at its step (ValueError otherwise).
    """
    toks = _TOKEN.findall(expression)
    if "".join(toks) != expression or len(toks) % 2 == 0 or not toks[0].isdigit():
        raise ValueError(f"not an arithmetic expression: {expression!r}")
    return Fraction(value_of([int(t) for t in toks[::2]], toks[1::2], strict))


def value_of(xs: Sequence[int], ops_seq: Sequence[str], strict: bool = True) -> int | Fraction:
    """Exact value of ``xs[0] ops[0] xs[1] ...`` (* and / first): an int, or a Fraction if inexact."""
    total: int | Fraction = 0
    sign = 1
    term: int | Fraction = xs[0]  # term stays an int while every division is exact
    for op, x in zip(ops_seq, xs[1:]):
        if op in "+-":
            total, sign, term = total + sign * term, (1 if op == "+" else -1), x
        elif op == "*":
            term *= x
        elif x == 0 or (strict and term % x != 0):
            raise ValueError(f"inexact or zero division in {join_expression(xs, ops_seq)!r}")
        elif isinstance(term, int) and term % x == 0:
            term //= x
        else:
            term = Fraction(term) / x
    return total + sign * term


def join_expression(xs: Sequence[int], ops_seq: Sequence[str]) -> str:
    """``[1, 3, 5], ["+", "*"]`` -> ``"1+3*5"``."""
    return str(xs[0]) + "".join(op + str(x) for op, x in zip(ops_seq, xs[1:]))
