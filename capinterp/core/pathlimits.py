"""Path names the file system will take, checked before any work.

Each name is at most ``NAME_MAX`` bytes (255 on most file systems), the whole path at most
``PATH_MAX`` bytes (4096 on Linux), and there is no NUL character. Outputs and checkpoints check their paths with :func:`check_path` so that a name
the file system would refuse is a clear ValueError at the start, not an ``ENAMETOOLONG`` after
minutes of work."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["NAME_MAX", "check_path", "name_max", "path_max"]

NAME_MAX = 255  # bytes in one file name where the file system does not say


def _conf(folder: Path, name: str, default: int) -> int:
    try:
        value = os.pathconf(folder, name)
    except (OSError, ValueError, AttributeError):
        return default
    return value if isinstance(value, int) and value > 0 else default


def name_max(folder: str | os.PathLike) -> int:
    """The longest file name (bytes) the file system of ``folder`` takes (255 when it cannot say)."""
    return _conf(Path(folder), "PC_NAME_MAX", NAME_MAX)


def path_max(folder: str | os.PathLike) -> int:
    """The longest path (bytes) the system takes for ``folder``'s file system (4096 when it cannot say)."""
    return _conf(Path(folder), "PC_PATH_MAX", 4096)


def _short(name: str) -> str:
    return repr(name if len(name) <= 40 else f"{name[:24]}...{name[-12:]}")


def _is_dir(p: Path) -> bool:
    try:
        return p.is_dir()
    except (OSError, ValueError):
        return False


def check_path(path: str | os.PathLike, what: str, *, reserve: int = 0) -> Path:
    """``path`` as a Path after checking its names: ValueError (naming ``what``, the name and the
    limit) when a part is longer than its file system's ``NAME_MAX``, the absolute path (plus
    ``reserve`` bytes for names a caller adds below it) longer than ``PATH_MAX``, or it holds a NUL
    character. Limits are read from the deepest existing folder on the path."""
    text = os.fspath(path)
    if "\x00" in str(text):
        raise ValueError(f"{what} {str(text)!r} contains a NUL character, which no file name may hold")
    p = Path(text)
    absolute = p.absolute()
    here = Path(absolute.anchor)
    known = here  # the deepest existing folder: its file system sets the limits
    for part in absolute.parts[1:]:
        size, limit = len(os.fsencode(part)), name_max(known)
        if size > limit:
            raise ValueError(
                f"{what} {_short(str(text))}: the name {_short(part)} is {size} bytes long, but this file "
                f"system takes at most {limit} bytes per name; choose a shorter name"
            )
        here = here / part
        if known == here.parent and _is_dir(here):
            known = here
    size, limit = len(os.fsencode(str(absolute))) + reserve, path_max(known)
    if size > limit:
        raise ValueError(
            f"{what} {_short(str(text))}: the path is {size} bytes long (with room for the names written "
            f"under it), but the system takes at most {limit} bytes; choose a shorter path"
        )
    return p
