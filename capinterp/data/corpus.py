"""Plain text from a local data folder, for statistics that need "some text" (ROME's key covariance).

:func:`local_texts` walks a folder (``*.txt``, ``*.json``, ``*.jsonl``, ``*.csv``; sorted, so the
result is reproducible), keeps every string value with at least ``min_words`` words (a ``.txt``
file contributes its blank-line-separated paragraphs), and returns a seeded sample of ``n``
of them. Nothing is downloaded: the folder is the caller's, or the shared data folder
(``CAPINTERP_DATA``, see :func:`~capinterp.data.capability_sources.shared_data_dir`).
"""

from __future__ import annotations

import csv
import json
import os
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from capinterp.core import validate
from capinterp.data.capability_sources import shared_data_dir

__all__ = ["local_texts"]

SUFFIXES = (".txt", ".json", ".jsonl", ".csv")


def local_texts(
    data_dir: str | os.PathLike | None = None, *, n: int = 400, min_words: int = 8, seed: int = 0
) -> list[str]:
    """Up to ``n`` texts of at least ``min_words`` words found under ``data_dir`` (seeded sample).

    ``data_dir=None`` uses the shared data folder. Raises FileNotFoundError when the folder is
    missing and ValueError when it holds no usable text.
    """
    validate.positive_int("n", n)
    root = Path(data_dir) if data_dir is not None else shared_data_dir()
    if root is None or not root.is_dir():
        raise FileNotFoundError(
            f"data_dir {str(data_dir) if data_dir is not None else '(shared data folder)'!r} is not a folder; "
            "pass texts=[...] or data_dir= a folder of .txt/.json/.jsonl/.csv files (or set CAPINTERP_DATA)"
        )
    seen: set[str] = set()
    found: list[str] = []
    for path in sorted(p for p in root.rglob("*") if p.is_file() and p.suffix.lower() in SUFFIXES):
        for text in _texts_of(path):
            text = " ".join(text.split())
            if len(text.split()) >= min_words and text not in seen:
                seen.add(text)
                found.append(text)
    if not found:
        raise ValueError(f"no text of >= {min_words} words under {str(root)!r} ({', '.join(SUFFIXES)} files)")
    random.Random(seed).shuffle(found)
    return found[:n]


def _texts_of(path: Path) -> Iterator[str]:
    suffix = path.suffix.lower()
    try:
        if suffix == ".txt":
            yield from path.read_text(encoding="utf-8", errors="replace").split("\n\n")
        elif suffix == ".json":
            yield from _strings(json.loads(path.read_text(encoding="utf-8")))
        elif suffix == ".jsonl":
            for line in path.read_text(encoding="utf-8").splitlines():
                if line.strip():
                    yield from _strings(json.loads(line))
        else:
            with path.open(newline="", encoding="utf-8", errors="replace") as f:
                for row in csv.reader(f):
                    yield from row
    except (json.JSONDecodeError, UnicodeDecodeError, csv.Error):
        return  # not text we can read: skipped, like any other non-text file


def _strings(obj: Any) -> Iterator[str]:
    if isinstance(obj, str):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _strings(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _strings(v)
