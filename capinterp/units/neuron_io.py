"""The ``.capi`` file format of neuron results (format 2): writing, reading and checking one file or folder.

One safetensors file with one tensor, ``"scores"`` (float32) or ``"mask"`` (uint8), and metadata
``{"capinterp": JSON {type, format_version, shape, checksum, meta}}``; a folder path (existing, or
ending in "/") gets ``tensors.safetensors`` + ``meta.json``. ``checksum`` is the SHA-256 of the
tensor's bytes: a load verifies it, so flipped bytes are an error, not different scores (format 1
files, without it, still load). Saving never replaces by accident: an existing file must be a
capinterp file of the same type, an existing folder empty or a saved folder of the same type,
unless ``overwrite=True``.

This module knows bytes and headers only; :mod:`capinterp.units.neuron_tensor` turns them into objects.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
from safetensors import safe_open
from safetensors.torch import save_file
from torch import Tensor

__all__ = ["FORMAT_VERSION", "Header", "check_target", "checksum", "read", "write"]

FORMAT_VERSION = 2
TENSOR_FILE, META_FILE = "tensors.safetensors", "meta.json"

Header = dict[str, Any]


def _json_default(o: Any) -> Any:
    if isinstance(o, np.generic) or (isinstance(o, Tensor) and o.numel() == 1):
        return o.item()
    if isinstance(o, (set, frozenset, Path)):
        return sorted(o) if not isinstance(o, Path) else str(o)
    raise TypeError(f"metadata value {o!r} of type {type(o).__name__} is not JSON-serializable")


def invalid(path: Path, err: Exception | str) -> ValueError:
    """The error for a file that is not (or no longer) a valid capinterp file."""
    return ValueError(f"{path} is not a valid capinterp file (corrupted or truncated): {err}")


def checksum(t: Tensor) -> str:
    """SHA-256 of a tensor's bytes."""
    return hashlib.sha256(t.cpu().contiguous().numpy().tobytes()).hexdigest()


def _atomic_save(tensors: dict[str, Tensor], p: Path, blob: str) -> None:
    tmp = p.with_name(p.name + ".tmp")
    save_file(tensors, str(tmp), metadata={"capinterp": blob})
    os.replace(tmp, p)


def stored_type(p: Path) -> str | None:
    """The type recorded in a saved capinterp file / folder, None when it is not one."""
    try:
        if p.is_dir():
            blob: str | None = (p / META_FILE).read_text()
        else:
            with safe_open(str(p), framework="pt") as f:
                blob = (f.metadata() or {}).get("capinterp")
        return str(json.loads(blob)["type"]) if blob else None
    except Exception:
        return None


def check_target(p: Path, as_folder: bool, mine: str) -> None:
    """ValueError if saving a ``mine`` at ``p`` would replace something that is not our own kind of file."""
    if p.is_dir():
        entries = sorted(x.name for x in p.iterdir())
        if not entries:
            return
        if set(entries) <= {TENSOR_FILE, META_FILE}:
            kind = stored_type(p)
            if kind == mine:
                return
            raise ValueError(
                f"{p} holds a saved {kind or 'unreadable capinterp folder'}; saving a {mine} "
                "there would replace it: choose another path or pass overwrite=True"
            )
        raise ValueError(
            f"{p} is an existing folder with other files ({', '.join(entries[:3])}"
            f"{', ...' if len(entries) > 3 else ''}); save to a new path, e.g. {p / 'scores.capi'}, "
            "or pass overwrite=True"
        )
    if p.exists():
        if as_folder:
            raise ValueError(f"{p} is an existing file, not a folder; choose another path")
        kind = stored_type(p)
        if kind != mine:
            what = f"a saved {kind}" if kind else "a file that is not a capinterp file"
            raise ValueError(
                f"{p} is {what}; saving a {mine} there would replace it: choose another path or pass overwrite=True"
            )


def write(p: Path, as_folder: bool, name: str, stored: Tensor, header: Header) -> Path:
    """Write one tensor ``name`` and its header (``checksum`` and ``format_version`` added) atomically."""
    header = {**header, "format_version": FORMAT_VERSION, "checksum": checksum(stored)}
    blob = json.dumps(header, default=_json_default, sort_keys=True)
    tensors = {name: stored}
    if as_folder:
        p.mkdir(parents=True, exist_ok=True)
        _atomic_save(tensors, p / TENSOR_FILE, blob)
        tmp = p / (META_FILE + ".tmp")
        tmp.write_text(blob)
        os.replace(tmp, p / META_FILE)
    else:
        p.parent.mkdir(parents=True, exist_ok=True)
        _atomic_save(tensors, p, blob)
    return p


def _read_safetensors(p: Path) -> tuple[str | None, dict[str, Tensor]]:
    try:
        with safe_open(str(p), framework="pt") as f:
            md = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open is not iterable)
    except Exception as e:  # safetensors raises its own SafetensorError, or OSError
        raise invalid(p, e) from e
    return md.get("capinterp"), tensors


def read(p: Path) -> tuple[Header, dict[str, Tensor]]:
    """The checked header (type, format_version, shape, meta; checksum when recorded) and the tensors
    stored at ``p`` (file or folder); errors for a missing, foreign or damaged file."""
    if not p.exists():
        raise FileNotFoundError(f"no capinterp file or folder at {p}")
    if p.is_dir():
        missing = [f for f in (TENSOR_FILE, META_FILE) if not (p / f).is_file()]
        if missing:
            raise FileNotFoundError(f"{p} is a folder without {missing}; not a saved capinterp folder")
        blob: str | None = (p / META_FILE).read_bytes().decode("utf-8", errors="replace")
        _, tensors = _read_safetensors(p / TENSOR_FILE)
    else:
        blob, tensors = _read_safetensors(p)
        if blob is None:
            raise invalid(p, "a safetensors file without 'capinterp' metadata")
    try:
        header = json.loads(blob)  # type: ignore[arg-type]
        header = {k: header[k] for k in ("type", "format_version", "shape", "meta")} | (
            {"checksum": header["checksum"]} if "checksum" in header else {}
        )
    except (ValueError, KeyError, TypeError) as e:
        raise invalid(p, f"bad metadata ({type(e).__name__}: {e})") from e
    return header, tensors
