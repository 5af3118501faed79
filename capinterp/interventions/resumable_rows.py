"""Rows of a long measurement saved as they finish, so a rerun continues where it stopped.

:func:`capinterp.interventions.faithfulness.faithfulness`'s random band is its longest part: on a
full run, 2 + 2 x sizes x draws masks (482 at MIB's sizes and 20 draws) times every example. With
``checkpoint=``, the masks run in chunks and each chunk's per-example values are appended to one
``.npz`` file (written to a temporary name, then renamed: a crash leaves the last complete file).
The file carries a tag of everything the rows depend on (the model's weights, units, sizes, draws,
seed, ablation, metric, data); a file with another tag, or a damaged one, is ignored and replaced.
"""

from __future__ import annotations

import hashlib
import os
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from capinterp.core import distributed as dist

__all__ = ["CHUNK", "resumable_rows", "tag_of"]

#: masks per saved chunk: a few minutes of a packaged model on one CPU thread at 128 examples
CHUNK = 24


def tag_of(*parts: object) -> str:
    """A stable digest of ``parts`` (their ``repr``): equal settings give equal tags across processes."""
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:32]


def _load(path: Path, tag: str, n_rows: int) -> np.ndarray | None:
    try:
        with np.load(path, allow_pickle=False) as saved:
            if str(saved["tag"]) != tag:
                return None
            rows = np.asarray(saved["rows"])
    except (OSError, KeyError, ValueError, zipfile.BadZipFile, EOFError):
        return None  # missing or damaged: start over
    return rows if rows.ndim == 2 and len(rows) <= n_rows else None


def _save(path: Path, tag: str, rows: np.ndarray) -> None:
    if not dist.is_main():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}.npz")
    np.savez(tmp, tag=np.array(tag), rows=rows)
    os.replace(tmp, path)


def resumable_rows(
    measure: Callable[[int, int], np.ndarray],
    n_rows: int,
    checkpoint: str | os.PathLike,
    tag: str,
    chunk: int | None = None,
) -> np.ndarray:
    """``[n_rows, ...]``: ``measure(start, stop)`` (rows ``start:stop``) chunk by chunk (``chunk``
    rows, default :data:`CHUNK`), each chunk appended to ``checkpoint`` as it finishes; rows already
    saved there under ``tag`` are not measured again."""
    chunk = CHUNK if chunk is None else chunk
    path = Path(checkpoint)
    done = _load(path, tag, n_rows)
    parts = [] if done is None else [done]
    start = 0 if done is None else len(done)
    while start < n_rows:
        stop = min(start + chunk, n_rows)
        parts.append(np.asarray(measure(start, stop)))
        start = stop
        _save(path, tag, np.concatenate(parts))
    return np.concatenate(parts) if parts else np.zeros((0, 0))
