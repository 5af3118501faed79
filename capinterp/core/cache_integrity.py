"""Checksums of the model cache: what a conversion wrote is checked before it is loaded again.

A cache folder (one dequantized packaged model) holds a marker file, ``COMPLETE``, written last:
it lists every file of the folder with its size and SHA-256 (and, for a large file, the SHA-256 of
sampled blocks). :func:`check` compares the folder with it:

* ``"quick"`` (the default on every load): every file's size; the whole SHA-256 of each file up to
  64 MiB (config, tokenizer); the sampled-block hash of larger ones (the weights); and the
  safetensors header, whose tensors must end exactly at the end of the file. It catches a missing,
  truncated, extended or unreadable file, a damaged header and damage in the sampled blocks.
* ``"full"``: the SHA-256 of every byte of every file: catches any change, one flipped bit included.

:func:`sweep` deletes the temporary folders a killed conversion left beside the cache folder, but
only while no process holds the conversion lock (the one converting process holds it while its
temporary folder exists; the operating system releases it when that process dies).
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from capinterp.core.gguf_parts import sha256_file

__all__ = [
    "FULL",
    "LEGACY",
    "MARKER",
    "MODES",
    "QUICK",
    "CacheDamaged",
    "check",
    "describe",
    "orphans",
    "resolve_mode",
    "structure_problem",
    "sweep",
    "write_manifest",
]

MARKER = "COMPLETE"
QUICK, FULL = "quick", "full"
MODES = (QUICK, FULL)
#: :func:`check`'s answer for a folder whose marker predates checksums (no file list).
LEGACY = "written before checksums were kept"
_FORMAT = 1
_SMALL = 64 << 20  # files up to this size are hashed whole by the quick check too
_SAMPLES, _SAMPLE = 256, 1 << 16  # 256 blocks of 64 KiB, evenly spaced, first and last included
_MAX_HEADER = 100 << 20  # safetensors' own limit on its JSON header


class CacheDamaged(OSError):
    """A damaged model cache that could not be rebuilt; the message names the rebuild command (an
    OSError: the command line prints it as one line, exit status 2)."""


def resolve_mode(verify: str | None) -> str:
    """``verify``, else ``$CAPINTERP_CACHE_VERIFY``, else ``"quick"``; ValueError naming the choices."""
    mode = verify if verify is not None else (os.environ.get("CAPINTERP_CACHE_VERIFY") or QUICK)
    if mode not in MODES:
        where = "verify" if verify is not None else "CAPINTERP_CACHE_VERIFY"
        raise ValueError(f"{where} must be 'quick' or 'full', got {mode!r}")
    return mode


def _sampled(path: Path, size: int) -> str:
    """SHA-256 of the size and of ``_SAMPLES`` blocks at evenly spaced offsets (first and last included)."""
    h = hashlib.sha256(str(size).encode())
    with open(path, "rb") as f:
        for i in range(_SAMPLES):
            f.seek(max(0, size - _SAMPLE) * i // (_SAMPLES - 1))
            h.update(f.read(_SAMPLE))
    return h.hexdigest()


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_file() and p.name != MARKER and not p.name.startswith("."))


def describe(folder: Path) -> dict[str, dict[str, Any]]:
    """``{file name: {"size", "sha256"[, "sampled"]}}`` for every file of ``folder`` but the marker."""
    out: dict[str, dict[str, Any]] = {}
    for p in _files(folder):
        size = p.stat().st_size
        out[p.name] = {"size": size, "sha256": sha256_file(p)}
        if size > _SMALL:
            out[p.name]["sampled"] = _sampled(p, size)
    return out


def write_manifest(folder: Path, saved: float | None = None) -> None:
    """Write ``folder``'s marker with every file's checksums, atomically (a temporary file renamed)."""
    text = json.dumps({"saved": time.time() if saved is None else saved, "format": _FORMAT, "files": describe(folder)})
    fd, tmp = tempfile.mkstemp(prefix="." + MARKER + ".", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, folder / MARKER)
    finally:
        Path(tmp).unlink(missing_ok=True)


def structure_problem(path: Path) -> str | None:
    """What is wrong with a safetensors file's structure (header unreadable, tensors not ending at the
    end of the file), or None."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            n = int.from_bytes(head, "little") if len(head) == 8 else -1
            if n < 0 or n > min(size - 8, _MAX_HEADER):
                return f"{path.name} is too short for its header ({size} bytes)"
            meta = json.loads(f.read(n))
        end = max((int(t["data_offsets"][1]) for k, t in meta.items() if k != "__metadata__"), default=0)
    except OSError as err:
        return f"{path.name} is unreadable ({err.strerror or err})"
    except (ValueError, KeyError, TypeError, IndexError, AttributeError):
        return f"{path.name} has a damaged header"
    if 8 + n + end != size:
        return f"{path.name} has {size} bytes, its header describes {8 + n + end}"
    return None


def _file_problem(path: Path, want: dict[str, Any], mode: str) -> str | None:
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return f"{path.name} is missing"
    except OSError as err:
        return f"{path.name} is unreadable ({err.strerror or err})"
    if size != want.get("size"):
        return f"{path.name} has {size} bytes, {want.get('size')} when written"
    if path.suffix == ".safetensors" and (problem := structure_problem(path)):
        return problem
    try:
        if mode == FULL or "sampled" not in want:
            if sha256_file(path) != want.get("sha256"):
                return f"{path.name}'s SHA-256 differs from the one recorded when it was written"
        elif _sampled(path, size) != want["sampled"]:
            return f"{path.name}'s sampled blocks differ from those recorded when it was written"
    except OSError as err:
        return f"{path.name} is unreadable ({err.strerror or err})"
    return None


def check(folder: Path, mode: str = QUICK) -> str | None:
    """None when ``folder`` matches its marker's checksums (``mode``: ``"quick"`` or ``"full"``);
    :data:`LEGACY` when its marker has no checksums; else the first problem, in a few words."""
    try:
        marker = json.loads((folder / MARKER).read_text())
        files = marker.get("files") if isinstance(marker, dict) else None
    except FileNotFoundError:
        return f"its {MARKER} marker is missing"
    except (OSError, ValueError) as err:
        return f"its {MARKER} marker is unreadable ({type(err).__name__})"
    if files is None:
        return LEGACY
    if not isinstance(files, dict) or not files:
        return f"its {MARKER} marker lists no files"
    for name, want in files.items():
        if problem := _file_problem(folder / name, want if isinstance(want, dict) else {}, mode):
            return problem
    return None


def orphans(folder: Path) -> list[Path]:
    """Temporary folders and files a conversion of ``folder`` left: ``<name>.tmp*`` beside it."""
    try:
        return sorted(folder.parent.glob(glob.escape(folder.name) + ".tmp*"))
    except OSError:
        return []


def sweep(folder: Path, lock_path: str | None = None) -> list[Path]:
    """Delete :func:`orphans` of ``folder`` when no process is converting: ``lock_path`` (the conversion
    lock) taken without waiting, or already held by the caller (``lock_path=None``). Returns what was
    deleted; nothing when the lock is busy (a live process owns the temporary folder)."""
    if not orphans(folder):
        return []
    if lock_path is None:
        return _remove(orphans(folder))
    from filelock import FileLock, Timeout

    lock = FileLock(lock_path)
    try:
        lock.acquire(timeout=0)
    except (Timeout, OSError):
        return []
    try:
        return _remove(orphans(folder))
    finally:
        lock.release()


def _remove(paths: list[Path]) -> list[Path]:
    gone = []
    for p in paths:
        try:
            shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
            gone.append(p)
        except OSError:
            pass  # not ours to fight over: left for the next load
    return gone
