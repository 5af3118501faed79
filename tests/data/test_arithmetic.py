"""Tests for the arithmetic dataset generator, its templates and answer parsing (no model)."""

from __future__ import annotations

import re
import time
from collections import Counter
from fractions import Fraction

import pytest

from capinterp.data import Example, arithmetic, arithmetic_suite, describe, is_correct, parse_answer
from capinterp.data.parsing import evaluate

CJK = re.compile(r"[\u4e00-\u9fff]")


def reference_value(expr: str) -> Fraction:
    """Independent check: Python's own precedence on Fractions, plus per-step exact division."""
    assert re.fullmatch(r"\d+([-+*/]\d+)*", expr), expr
    for term in re.split(r"[-+]", expr):  # within a term, * and / go left to right
        parts = re.split(r"([*/])", term)
        acc = Fraction(int(parts[0]))
        for op, num in zip(parts[1::2], parts[2::2]):
            if op == "/":
                assert int(num) != 0 and acc % int(num) == 0, f"inexact division in {expr}"
                acc /= int(num)
            else:
                acc *= int(num)
    return eval(re.sub(r"(\d+)", r"Fraction(\1)", expr), {"Fraction": Fraction})


def operators(expr: str) -> list[str]:
    return re.findall(r"[-+*/]", expr)


@pytest.mark.parametrize("fmt", ["DG", "MQ", "TF"])
@pytest.mark.parametrize("n_ops", [1, 2, 3, 4, 5])
def test_answers_are_exact_integers(fmt: str, n_ops: int) -> None:
    ds = arithmetic("+-*/", 120, fmt, "en", seed=1, n_ops=n_ops)
    assert len(ds) == 120 and all(isinstance(e, Example) for e in ds)
    for e in ds:
        value = reference_value(e.meta["expression"])
        assert value.denominator == 1 and e.meta["answer"] == int(value)
        assert evaluate(e.meta["expression"]) == value
        assert operators(e.meta["expression"]) == e.meta["ops"] and len(e.meta["ops"]) == n_ops
        assert e.meta["op_set"] == sorted(set(e.meta["ops"]))
        if fmt == "DG":
            assert e.target == str(e.meta["answer"])


def test_multi_digit_operands() -> None:
    for digits, lo, hi in [(2, 10, 99), ((1, 2), 0, 99), (3, 100, 999), (4, 1000, 9999)]:
        ds = arithmetic("+-*/", 80, "DG", "en", seed=2, digits=digits, n_ops=2)
        nums = [int(x) for e in ds for x in re.findall(r"\d+", e.meta["expression"])]
        assert all(lo <= x <= hi for x in nums), digits
        for e in ds:
            assert reference_value(e.meta["expression"]) == e.meta["answer"]
    mixed = arithmetic("+", 200, "DG", "en", digits=(1, 2))
    lengths = Counter(len(x) for e in mixed for x in re.findall(r"\d+", e.meta["expression"]))
    assert lengths[1] > 50 and lengths[2] > 50


def test_division_examples_are_nontrivial() -> None:
    ds = arithmetic("/", 200, "DG", "en", seed=0)
    divisors = Counter(int(e.meta["expression"].split("/")[1]) for e in ds)
    assert 0 not in divisors and len(divisors) == 9  # every divisor 1..9 is used
    assert divisors[1] < 60


def test_one_op_balance_and_remainder_to_first() -> None:
    ds = arithmetic("+-*/", 10, "DG", "en")
    assert Counter(e.meta["ops"][0] for e in ds) == {"+": 3, "-": 3, "*": 2, "/": 2}
    ds = arithmetic(["*", "-"], 101, "MQ", "zh")
    assert Counter(e.meta["ops"][0] for e in ds) == {"*": 51, "-": 50}


@pytest.mark.parametrize("n_ops", [2, 3, 4, 5])
def test_multi_op_balance(n_ops: int) -> None:
    ds = arithmetic("+-*/", 200, "DG", "en", seed=3, n_ops=n_ops)
    counts = Counter(op for e in ds for op in e.meta["ops"])
    assert set(counts) == set("+-*/") and max(counts.values()) - min(counts.values()) <= 1
    if n_ops <= 4:
        assert all(len(set(e.meta["ops"])) == n_ops for e in ds)
    assert len({tuple(e.meta["ops"]) for e in ds}) > 10  # varied combinations and orders
    sub = arithmetic("+*", 50, "DG", "en", n_ops=n_ops)
    assert all(set(e.meta["ops"]) <= {"+", "*"} for e in sub)


def test_mq_options() -> None:
    ds = arithmetic("+-*/", 400, "MQ", "en", seed=4)
    letters = Counter(e.target for e in ds)
    assert letters == {"A": 100, "B": 100, "C": 100, "D": 100}
    for e in ds:
        opts, ans = e.meta["options"], e.meta["answer"]
        assert len(opts) == 4 and len(set(opts)) == 4 and opts.count(ans) == 1
        assert "ABCD"[opts.index(ans)] == e.target == e.meta["correct"]
        query = e.prompt.split("\n\n")[-1]
        assert "(A) {}, (B) {}, (C) {}, and (D) {}".format(*opts) in query
        assert all(abs(o - ans) <= 100 for o in opts)
        if ans >= 0:
            assert min(opts) >= 0


@pytest.mark.parametrize("n", [100, 101])
def test_tf_balance_and_truth(n: int) -> None:
    ds = arithmetic("+-*/", n, "TF", "en", seed=5, style="fewshot")
    truths = Counter(e.meta["truth"] for e in ds)
    assert abs(truths[True] - truths[False]) == n % 2 and sum(truths.values()) == n
    for e in ds:
        assert e.meta["truth"] == (e.meta["shown"] == e.meta["answer"])
        assert e.target == ("Yes" if e.meta["truth"] else "No")
        assert f'"{e.meta["expression"]}={e.meta["shown"]}"' in e.prompt.split("\n\n")[-1]
        if not e.meta["truth"]:
            assert 0 < abs(e.meta["shown"] - e.meta["answer"]) <= 100


def test_allow_negative_false() -> None:
    for n_ops in (1, 2, 3):
        ds = arithmetic("-", 100, "DG", "en", n_ops=n_ops, allow_negative=False)
        assert all(e.meta["answer"] >= 0 for e in ds)
    assert any(e.meta["answer"] < 0 for e in arithmetic("-", 100, "DG", "en", allow_negative=True))


def test_reproducible_and_seed_dependent() -> None:
    kw = dict(n_ops=3, fmt="MQ")
    a, b = arithmetic("+-*/", 50, seed=7, **kw), arithmetic("+-*/", 50, seed=7, **kw)
    assert [(e.prompt, e.target, e.meta) for e in a] == [(e.prompt, e.target, e.meta) for e in b]
    c = arithmetic("+-*/", 50, seed=8, **kw)
    assert [e.meta["expression"] for e in a] != [e.meta["expression"] for e in c]
    assert [e.prompt for e in a] != [e.prompt for e in c]


def test_languages_share_expressions_and_zh_is_chinese() -> None:
    for fmt in ("DG", "MQ", "TF"):
        en = arithmetic("+-*/", 30, fmt, "en", seed=9, style="fewshot")
        zh = arithmetic("+-*/", 30, fmt, "zh", seed=9, style="fewshot")
        assert [e.meta["expression"] for e in en] == [e.meta["expression"] for e in zh]
        assert [e.target for e in en] == [e.target for e in zh]
        assert all(CJK.search(e.prompt) and e.prompt.endswith("：") for e in zh)
        assert not any(CJK.search(e.prompt) for e in en)
    zh_tf = arithmetic("+", 10, "TF", "zh", tf_labels=("是", "否"))
    assert {e.target for e in zh_tf} == {"是", "否"}


@pytest.mark.parametrize("fmt", ["DG", "MQ", "TF"])
@pytest.mark.parametrize("lang", ["en", "zh"])
def test_layout_has_no_space_and_shots_match(fmt: str, lang: str) -> None:
    answer_re = {"DG": r"-?\d+", "MQ": r"[ABCD]", "TF": r"(Yes|No)"}[fmt]
    ds = arithmetic("+-*/", 40, fmt, lang, seed=10, style="fewshot")
    for e in ds:
        assert e.prompt == e.prompt.rstrip() and e.target == e.target.strip() and e.target
        assert e.prompt.endswith((":", "：")) and re.fullmatch(answer_re, e.target)
        blocks = e.prompt.split("\n\n")
        assert len(blocks) == 5 and e.meta["shots"] == 4
        query_head = f'"{e.meta["expression"]}=' if lang == "en" else f"“{e.meta['expression']}="
        assert query_head in blocks[-1]
        for block, shot_expr in zip(blocks[:-1], e.meta["shot_expressions"]):
            assert query_head not in block and shot_expr != e.meta["expression"]
            assert re.search(r"[:：]" + answer_re + "$", block), block
            assert block[:8] == blocks[-1][:8]  # same template
    zero = arithmetic("+-*/", 40, fmt, lang, seed=10, style="zeroshot")
    assert all("\n\n" not in e.prompt and e.meta["shots"] == 0 for e in zero)
    assert [e.target for e in zero] == [e.target for e in ds]


def test_shots_follow_the_op_distribution() -> None:
    ds = arithmetic("*", 20, "DG", "en", shots=3)
    assert all(len(e.meta["shot_expressions"]) == 3 for e in ds)
    assert all(operators(s) == ["*"] for e in ds for s in e.meta["shot_expressions"])
    small = arithmetic("/", 100, "TF", "en", shots=8)  # only 32 exact a/b: collisions are likely
    for e in small:
        shots = e.meta["shot_expressions"]
        assert len(set(shots)) == 8 and e.meta["expression"] not in shots
        assert all(f'"{e.meta["expression"]}=' not in b for b in e.prompt.split("\n\n")[:-1])


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(n=0), "n must be an integer >= 1"),
        (dict(n=2.5), "n must be an integer >= 1"),
        (dict(ops="+x"), "unknown op"),
        (dict(ops=""), "ops is empty"),
        (dict(ops=[]), "ops is empty"),
        (dict(fmt="QA"), "unknown fmt 'QA'; valid formats are DG, MQ, TF"),
        (dict(lang="fr"), "unknown lang 'fr'; valid languages are en, zh"),
        (dict(n_ops=0), r"n_ops must be an int in 1\.\.5"),
        (dict(n_ops=6), r"n_ops must be an int in 1\.\.5"),
        (dict(digits=0), "digits must be"),
        (dict(digits=(2, 1)), "digits must be"),
        (dict(style="chat"), "unknown style 'chat'"),
        (dict(shots=-1), "shots must be an integer >= 0"),
        (dict(tf_labels=("Yes", "Yes")), "tf_labels"),
        (dict(lang="zh"), "compact DG prompts .* have no words"),  # would silently equal lang="en"
    ],
)
def test_bad_arguments(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        arithmetic(**kwargs)


def test_impossible_requests_raise_quickly() -> None:
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match="could not generate a valid expression"):
        arithmetic("/", 5, "DG", "en", n_ops=2, digits=2)  # a/b/c with 2-digit operands
    with pytest.raises(ValueError, match="unique=True"):
        arithmetic("/", 40, "DG", "en", unique=True)  # only 32 exact a/b with a in 0..9, b in 1..9
    assert time.perf_counter() - t0 < 5.0
    ds = arithmetic("+", 100, "DG", "en", unique=True)
    assert len({e.meta["expression"] for e in ds}) == 100


def test_fast_generation() -> None:
    for fmt in ("DG", "MQ"):
        t0 = time.perf_counter()
        ds = arithmetic("+-*/", 1000, fmt, "en", seed=0)  # few-shot: 5000 expressions
        assert len(ds) == 1000 and time.perf_counter() - t0 < 1.0, fmt


def test_suite_and_describe() -> None:
    suite = arithmetic_suite("+-", fmts=("DG", "TF"), langs=("en", "zh"), n=12, seed=3, style="fewshot")
    with pytest.raises(ValueError, match="compact DG"):  # checked for every pair before generating
        arithmetic_suite("+-", fmts=("TF", "DG"), langs=("en", "zh"), n=12)
    assert set(suite) == {(o, f, lg) for o in "+-" for f in ("DG", "TF") for lg in ("en", "zh")}
    assert all(e.meta["ops"] == [k[0]] and e.meta["fmt"] == k[1] for k, v in suite.items() for e in v)
    assert describe(suite[("+", "DG", "en")]).startswith("arithmetic ops=+ fmt=DG lang=en n=12 digits=1 seed=3")
    assert "fmt=DG,TF" in describe(suite[("+", "DG", "en")] + suite[("+", "TF", "en")])
    with pytest.raises(ValueError, match="unknown fmt"):
        arithmetic_suite("+", fmts=("DG", "XX"), n=4)


@pytest.mark.parametrize(
    "fmt, text, expected",
    [
        ("DG", "16", "16"),
        ("DG", " -3\n", "-3"),
        ("DG", "12abc", "12"),
        ("DG", "007", "7"),
        ("DG", "abc", None),
        ("DG", "", None),
        ("MQ", "C", "C"),
        ("MQ", " (a) 10", "A"),
        ("MQ", "b)", "B"),
        ("MQ", "d", "D"),
        ("MQ", "E", None),
        ("MQ", "Dog", None),
        ("TF", "Yes", "Yes"),
        ("TF", " no.", "No"),
        ("TF", "TRUE", "Yes"),
        ("TF", "false", "No"),
        ("TF", "是", "Yes"),
        ("TF", "否", "No"),
        ("TF", "对", "Yes"),
        ("TF", "错", "No"),
        ("TF", "not sure", None),
        ("TF", "maybe", None),
    ],
)
def test_parse_answer(fmt: str, text: str, expected: str | None) -> None:
    assert parse_answer(fmt, text) == expected


def test_parse_answer_rejects_unknown_format() -> None:
    with pytest.raises(ValueError, match="unknown fmt"):
        parse_answer("XX", "1")


def test_is_correct() -> None:
    dg = arithmetic("+", 1, "DG", "en")[0]
    ans = dg.target
    assert is_correct(dg, ans) and is_correct(dg, " " + ans + "\n")
    assert not is_correct(dg, ans + "0") and not is_correct(dg, "") and not is_correct(dg, "x")
    mq = arithmetic("+", 1, "MQ", "en")[0]
    assert is_correct(mq, f"({mq.target.lower()})")
    assert not is_correct(mq, next(c for c in "ABCD" if c != mq.target))
    tf = arithmetic("+", 1, "TF", "zh", tf_labels=("是", "否"))[0]
    assert is_correct(tf, "Yes" if tf.target == "是" else "no")
    plain = Example("The capital of France is", " Paris")
    assert is_correct(plain, " Paris, of course") and not is_correct(plain, " Lyon")


@pytest.mark.parametrize("fmt", ["DG", "MQ", "TF"])
def test_compact_style_is_default_one_line_per_item(fmt: str) -> None:
    ds = arithmetic("+-*/", 20, fmt, "en", seed=4)
    for e in ds:
        lines = e.prompt.split("\n")
        assert e.meta["style"] == "compact" and len(lines) == 5
        assert lines[-1].startswith(e.meta["expression"] + "=")
        assert all(not ln.startswith(e.meta["expression"] + "=") for ln in lines[:-1])
        assert e.prompt == e.prompt.rstrip()
    if fmt == "DG":
        assert all(e.prompt.endswith(e.meta["expression"] + "=") for e in ds)
        assert all(ln.rsplit("=", 1)[1].lstrip("-").isdigit() for e in ds for ln in e.prompt.split("\n")[:-1])
