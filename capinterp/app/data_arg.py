"""``--data`` of ``capinterp evaluate`` / ``localize``: a file of facts, or a named dataset.

A FILE is read by :func:`capinterp.data.load_jsonl` (``.csv`` with a header row, ``.json``,
``.jsonl``): columns ``prompt`` and ``target``, and ``subject`` where causal tracing and knowledge
circuits need it; targets are spaced by :func:`capinterp.data.facts.join_target` as every loader
spaces them. A NAME is one of :data:`NAMED`: the package's own facts (``builtin``), the public sets
docs/data.md lists, read from the folder named by ``CAPINTERP_DATA``, or a capability of
:func:`capinterp.data.load_capability`. Every problem is a one-line error before a model loads.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from capinterp.core.example import Example

__all__ = ["NAMED", "data_option", "load_data"]

#: Named datasets: name -> (what it is, the file under ``CAPINTERP_DATA`` or None).
NAMED: dict[str, tuple[str, str | None]] = {
    "builtin": ("14 famous facts written for capinterp (no data folder needed)", None),
    "known_1000": ("ROME's known facts", "rome_knowns/known_1000.json"),
    "counterfact": ("CounterFact facts, true objects", "counterfact/counterfact-edit.json"),
    "pararel": ("knowledge-neurons ParaRel prompts, every bag in one list", "knowledge_neurons/data_11.json"),
    **{
        c: (f"capability {c!r} (capinterp.data.load_capability, test split)", None)
        for c in ("add", "sub", "mul", "div", "math_word", "sentiment", "code")
    },
}


def data_option(p: argparse.ArgumentParser) -> None:
    """Add ``--data``."""
    p.add_argument(
        "--data",
        default=None,
        metavar="FILE|NAME",
        help="examples to use instead of generated arithmetic (default: generated arithmetic): a .csv, "
        ".json or .jsonl file with prompt and target columns (and subject, which causal_trace and "
        f"knowledge_circuit need), or a named dataset: {', '.join(NAMED)} (known_1000, counterfact and "
        "pararel are read from the folder named by CAPINTERP_DATA)",
    )


def _shared_file(name: str, rel: str) -> Path:
    from capinterp.data.capability_sources import shared_data_dir

    root = shared_data_dir()
    if root is None:
        raise FileNotFoundError(
            f"--data {name}: reads {rel} from the data folder, but CAPINTERP_DATA is not set; "
            f"set it to the folder holding {rel}, or pass the file's path as --data"
        )
    path = root / rel
    if not path.is_file():
        raise FileNotFoundError(f"--data {name}: {path} not found (CAPINTERP_DATA={str(root)!r})")
    return path


def _named(name: str, limit: int | None, seed: int) -> list[Example]:
    from capinterp import data

    rel = NAMED[name][1]
    if name == "builtin":
        return data.builtin_facts(limit)
    if name == "known_1000":
        return data.load_known_facts(_shared_file(name, str(rel)), limit=limit)
    if name == "counterfact":
        return data.load_counterfact(_shared_file(name, str(rel)), limit=limit)
    if name == "pararel":
        rows = [e for bag in data.load_pararel_bags(_shared_file(name, str(rel))) for e in bag]
        return rows if limit is None else rows[:limit]
    return data.load_capability(name, 100 if limit is None else limit, seed=seed, split="test")


def load_data(spec: str, *, limit: int | None = None, seed: int = 0) -> list[Example]:
    """The Examples ``--data spec`` names (the first ``limit`` records of a file; ``seed`` picks a
    capability's sample). FileNotFoundError / ValueError naming the problem."""
    from capinterp.data import load_jsonl

    path = Path(spec).expanduser()
    if not path.exists():
        if spec in NAMED:
            return _named(spec, limit, seed)
        raise FileNotFoundError(
            f"--data {spec!r}: no such file, and not a named dataset ({', '.join(NAMED)}); "
            "give a .csv, .json or .jsonl file with prompt and target columns"
        )
    if path.is_dir():
        raise ValueError(f"--data {spec!r} is a folder; give the .csv, .json or .jsonl file inside it")
    try:
        return load_jsonl(path, "prompt", "target", limit=limit)
    except KeyError as err:  # a record without the prompt or target column
        raise ValueError(
            f"--data {spec!r} needs the columns prompt and target (and subject for causal_trace / "
            f"knowledge_circuit): {err.args[0] if err.args else err}"
        ) from None
