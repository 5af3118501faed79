"""Output folders of the command line: checked before a model loads, and held by one run at a time.

:func:`check_out` walks the whole ``--out`` path (``a/b/c``: every part that exists must be a
folder, and the deepest existing one writable), so a bad path is a one-line error before any
work. :func:`hold` takes an advisory lock on the folder (``DIR/.capinterp.lock``, the
``filelock`` package, released by the OS if the process dies) and records the holder's process
id in ``DIR/.capinterp.owner``; a second run on the same folder stops at once with
:class:`FolderInUse` naming that process, and the first run's files stay untouched. A run that is
killed (SIGKILL) cannot remove its owner file; it blocks nothing (the lock died with the process),
says so in its own text, and the next run on the folder replaces it with a note on stderr.
A dangling symbolic link, or a name longer than the file system takes, is a one-line error too.
Under ``torchrun`` only rank 0 (``RANK`` unset or 0) takes the lock: the ranks of one run share
their folder.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock, Timeout

from capinterp.core.atomic import write_atomic
from capinterp.core.pathlimits import check_path

__all__ = ["LOCK_NAME", "OWNER_NAME", "FolderInUse", "check_out", "hold"]

LOCK_NAME = ".capinterp.lock"
OWNER_NAME = ".capinterp.owner"
#: Bytes kept free for the names a command writes in its folder (``{method}-{key}.ckpt.rank<r>-of-<n>``).
NAME_ROOM = 160


class FolderInUse(RuntimeError):
    """Another process holds the output folder's lock."""


def check_out(flag: str, out: str | os.PathLike) -> Path:
    """``out`` as a Path after checking it can be a writable output folder; ValueError naming the
    part of the path that is not a folder, or the folder that is not writable."""
    if str(out) == "":
        raise ValueError(f"{flag} is empty; give a folder path")
    path = check_path(out, flag, reserve=NAME_ROOM)
    absolute = path if path.is_absolute() else Path.cwd() / path
    deepest = Path(absolute.anchor)
    for part in reversed([absolute, *absolute.parents]):
        if not part.exists():
            if part.is_symlink():  # a link to nothing: mkdir would fail on it
                raise ValueError(
                    f"{flag} {str(out)!r}: {str(part)!r} is a symbolic link to {os.readlink(part)!r}, which "
                    "does not exist; create that folder, remove the link, or choose another folder"
                )
            break
        if not part.is_dir():
            what = "is an existing file" if part == absolute else f"has {str(part)!r}, an existing file, as a parent"
            raise ValueError(f"{flag} {str(out)!r} {what}, not a folder; choose a folder path")
        deepest = part
    if not os.access(deepest, os.W_OK | os.X_OK):
        raise ValueError(f"{flag} {str(out)!r}: folder {str(deepest)!r} is not writable")
    return path


#: The owner file's second line: what it is, for whoever finds it after a killed run.
OWNER_TEXT = (
    "process id of the capinterp run using this folder; a file left by a killed run blocks nothing "
    "(the next run replaces it) and may be deleted"
)


def _replace_stale(owner: Path) -> None:
    """Say on stderr that ``owner`` (found while this process holds the lock) is a killed run's."""
    try:
        pid = (owner.read_text().strip().splitlines() or ["?"])[0]
    except FileNotFoundError:
        return
    except OSError:
        pid = "?"
    print(
        f"note: {owner} named process {pid}, a run that ended without cleaning up (killed); "
        "it blocked nothing and is replaced",
        file=sys.stderr,
        flush=True,
    )


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
            pid = (owner.read_text().strip().splitlines() or ["unknown"])[0]
        except OSError:
            pid = "unknown"
        raise FolderInUse(
            f"output folder {str(folder)!r} is in use by process {pid} (another capinterp run); "
            "wait for it to finish or choose another --out"
        ) from None
    try:
        _replace_stale(owner)
        write_atomic(owner, f"{os.getpid()}\n{OWNER_TEXT}\n")
        yield folder
    finally:
        owner.unlink(missing_ok=True)
        lock.release()
