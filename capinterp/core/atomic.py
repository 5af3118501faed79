"""Atomic file writes: the one way capinterp replaces a file.

:func:`write_atomic` (bytes or text) and :func:`atomic_path` (for writers that take a file name, e.g.
plotly's ``write_html``) write into a temporary file in the target's own folder, ``fsync`` it, then
``os.replace`` it onto the target and ``fsync`` the folder. So a crash or a full disk leaves either
the old file or the new one, never a truncated mix, and no temporary file behind on an error.

* The temporary name is short (``.capi-XXXXXXXX.tmp``, 18 bytes) and independent of the target's
  name, so every legal file name (up to the file system's limit, 255 bytes) can be written; a
  longer name is refused before anything is written.
* A symbolic link at the target path is replaced by the new file, never followed: the file the
  link points to is left as it was.
* ``overwrite_ok`` decides what may be replaced: ``True`` anything but a folder; ``False`` nothing
  (FileExistsError when something, even a dangling link, is there); a callable is called with the
  path when something is there and raises (ValueError, naming what is there) to refuse.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from capinterp.core.pathlimits import name_max

__all__ = ["OverwriteRule", "atomic_path", "check_name", "write_atomic"]

_PREFIX, _SUFFIX = ".capi-", ".tmp"

#: What may be replaced at the target: True (anything but a folder), False (nothing), or a check
#: called with the path when something is there, which raises to refuse.
OverwriteRule = bool | Callable[[Path], None]

_UMASK = os.umask(0o022)
os.umask(_UMASK)


def check_name(path: str | os.PathLike) -> Path:
    """``path`` as a Path; ValueError (before any work) when its file name is longer than its folder's
    file system allows, or empty."""
    p = Path(path)
    if not p.name:
        raise ValueError(f"{str(path)!r} names no file")
    folder = p.parent if p.parent.is_dir() else Path(".")
    limit = name_max(folder)
    if (n := len(os.fsencode(p.name))) > limit:
        raise ValueError(f"file name {p.name[:40]!r}... is {n} bytes long; this file system allows {limit}")
    return p


def _allow(p: Path, overwrite_ok: OverwriteRule) -> None:
    if not os.path.lexists(p):
        return
    if p.is_dir() and not p.is_symlink():
        raise IsADirectoryError(f"{p} is an existing folder; a file cannot replace it: choose another path")
    if overwrite_ok is True:
        return
    if overwrite_ok is False:
        raise FileExistsError(f"{p} already exists; choose another path or allow replacing it")
    overwrite_ok(p)


def _fsync_dir(folder: Path) -> None:
    with contextlib.suppress(OSError):  # not every platform / file system can open or sync a folder
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, *, overwrite_ok: OverwriteRule = True) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; write the new file there. On a normal exit it is synced
    and renamed onto ``path`` (a link at ``path`` is replaced, not followed); on an exception it is
    deleted and ``path`` is left as it was."""
    p = check_name(path)
    _allow(p, overwrite_ok)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=_PREFIX, suffix=_SUFFIX, dir=p.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes it 0600; a saved file gets the usual mode
        _allow(p, overwrite_ok)  # something may have appeared meanwhile
        os.replace(tmp, p)
    except BaseException as err:
        with contextlib.suppress(OSError):
            tmp.unlink()
        if isinstance(err, OSError) and err.errno and err.filename is None:  # a full disk: name the file
            raise OSError(err.errno, err.strerror or os.strerror(err.errno), str(p)) from err
        raise
    _fsync_dir(p.parent)


def write_atomic(path: str | os.PathLike, data: bytes | str, *, overwrite_ok: OverwriteRule = True) -> Path:
    """Write ``data`` (text is UTF-8) to ``path`` atomically (see the module docstring); returns the path."""
    if not isinstance(data, (bytes, bytearray, memoryview, str)):
        raise TypeError(f"data must be bytes or str, got {type(data).__name__}")
    raw = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    with atomic_path(path, overwrite_ok=overwrite_ok) as tmp, open(tmp, "wb") as f:
        f.write(raw)
    return Path(path)
