"""Generic readers of record files (JSON, JSON lines, CSV) shared by the fact loaders."""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from capinterp.core import validate

__all__ = ["PathLike", "limit_records", "need_keys", "nonempty", "read_json_any", "records_of"]

PathLike = str | os.PathLike


def read_json_any(path: PathLike) -> Any:
    """Parse a .json file (one document) or .jsonl (one record a line); CSV gives a list of dicts."""
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"no such file: {p}")
    if p.is_dir():
        raise IsADirectoryError(f"{p} is a folder; pass the data file inside it")
    if p.suffix.lower() == ".csv":
        with open(p, newline="", encoding="utf-8-sig") as fh:
            return list(csv.DictReader(fh))
    text = p.read_text(encoding="utf-8-sig")
    if not text.strip():
        raise ValueError(f"{p} is empty")
    if p.suffix.lower() in (".jsonl", ".ndjson"):
        return _parse_jsonl(text, p)
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        try:  # a .json file that is really JSON lines
            return _parse_jsonl(text, p)
        except ValueError:
            raise ValueError(f"{p} is neither JSON nor JSON lines: {err}") from None


def _parse_jsonl(text: str, p: Path) -> list[Any]:
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise ValueError(f"{p}, line {n}: not valid JSON ({err})") from None
    return out


_LIST_KEYS = ("data", "examples", "records", "instances", "items", "rows", "facts", "train", "test")


def records_of(doc: Any, path: PathLike) -> list[Any]:
    """The list of records in a parsed document: a list, ``{"data": [...]}``-like, or ``{id: record}``."""
    if isinstance(doc, list):
        return doc
    if isinstance(doc, dict):
        for k in _LIST_KEYS:
            if isinstance(doc.get(k), list):
                return doc[k]
        lists = [v for v in doc.values() if isinstance(v, list)]
        if len(lists) == 1 and lists[0] and isinstance(lists[0][0], dict):
            return lists[0]
        if doc and all(isinstance(v, dict) for v in doc.values()):
            return [{"id": k, **v} for k, v in doc.items()]
        raise ValueError(
            f"{path}: a JSON object whose records could not be found; expected a list, an object with "
            f"one of the keys {list(_LIST_KEYS)} holding a list, or an object of id -> record"
        )
    raise ValueError(f"{path}: expected a list of records, got {type(doc).__name__}")


def need_keys(rec: Any, keys: Sequence[str], i: int, path: PathLike, what: str) -> None:
    """Check record ``i`` of ``path``: ValueError when it is not a dict, KeyError naming the first missing key."""
    if not isinstance(rec, dict):
        raise ValueError(f"{path}: record {i} is a {type(rec).__name__}, expected an object ({what})")
    missing = [k for k in keys if k not in rec]
    if missing:
        raise KeyError(
            f"{path}: record {i} has no key {missing[0]!r} (not a {what} file? its keys: {sorted(rec)[:12]})"
        )


def nonempty(out: list, path: PathLike, why: str = "") -> list:
    """``out`` itself; ValueError naming ``path`` (and ``why``) when it is empty."""
    if not out:
        raise ValueError(f"{path}: no usable records{(' ' + why) if why else ''}")
    return out


def limit_records(records: list, limit: int | None) -> list:
    """The first ``limit`` records (all when ``limit`` is None); ValueError for a limit below 1."""
    if limit is None:
        return records
    limit = validate.positive_int("limit", limit)
    return records[:limit]
