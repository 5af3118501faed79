"""Output folders of the command line: checked before a model loads, and held by one run at a time.

:func:`check_out` walks the whole ``--out`` path (``a/b/c``: every part that exists must be a
folder, and the deepest existing one writable), so a bad path is a one-line error before any
work. :func:`hold` takes an advisory lock on the folder (``DIR/.capinterp.lock``, the
``filelock`` package, released by the OS if the process dies) and records the holder's process
id in ``DIR/.capinterp.owner``; a second run on the same folder stops at once with
:class:`FolderInUse` naming that process, and the first run's files stay untouched.
Under ``torchrun`` only rank 0 (``RANK`` unset or 0) takes the lock: the ranks of one run share
their folder.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock, Timeout

__all__ = ["LOCK_NAME", "OWNER_NAME", "FolderInUse", "check_out", "hold"]

LOCK_NAME = ".capinterp.lock"
OWNER_NAME = ".capinterp.owner"


class FolderInUse(RuntimeError):
    """Another process holds the output folder's lock."""


def check_out(flag: str, out: str | os.PathLike) -> Path:
    """``out`` as a Path after checking it can be a writable output folder; ValueError naming the
    part of the path that is not a folder, or the folder that is not writable."""
    path = Path(out)
    if str(out) == "":
        raise ValueError(f"{flag} is empty; give a folder path")
    absolute = path if path.is_absolute() else Path.cwd() / path
    deepest = Path(absolute.anchor)
    for part in reversed([absolute, *absolute.parents]):
        if not part.exists():
            break
        if not part.is_dir():
            what = "is an existing file" if part == absolute else f"has {str(part)!r}, an existing file, as a parent"
            raise ValueError(f"{flag} {str(out)!r} {what}, not a folder; choose a folder path")
        deepest = part
    if not os.access(deepest, os.W_OK | os.X_OK):
        raise ValueError(f"{flag} {str(out)!r}: folder {str(deepest)!r} is not writable")
    return path


def _rank0() -> bool:
    return int(os.environ.get("RANK", "0")) == 0


@contextmanager
def hold(folder: str | os.PathLike) -> Iterator[Path]:
    """Create ``folder`` and hold its lock for the ``with`` block; :class:`FolderInUse` (naming the
    holder's process id) when another process holds it. A no-op lock on torchrun ranks above 0."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    if not _rank0():
        yield folder
        return
    lock = FileLock(str(folder / LOCK_NAME), timeout=0)
    owner = folder / OWNER_NAME
    try:
        lock.acquire()
    except Timeout:
        try:
            pid = owner.read_text().strip() or "unknown"
        except OSError:
            pid = "unknown"
        raise FolderInUse(
            f"output folder {str(folder)!r} is in use by process {pid} (another capinterp run); "
            "wait for it to finish or choose another --out"
        ) from None
    try:
        owner.write_text(str(os.getpid()))
        yield folder
    finally:
        owner.unlink(missing_ok=True)
        lock.release()
