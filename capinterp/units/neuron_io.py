"""The ``.capi`` file format of neuron results (format 3): writing, reading and checking one file or folder.

One safetensors file with one tensor, ``"scores"`` (float32) or ``"mask"`` (uint8), and metadata
``{"capinterp": JSON {type, format_version, shape, checksum, header_checksum, meta}}``; a folder
path (existing, or ending in "/") gets ``tensors.safetensors`` + ``meta.json``. ``checksum`` is the
SHA-256 of the tensor's bytes and ``header_checksum`` the SHA-256 of the rest of the header in
canonical JSON (:func:`capinterp.units.saved.digest`), so it covers the payload checksum too. A load
verifies every checksum the file has, whatever its ``format_version`` says: an edited fingerprint,
method, model name or parameter, or a flipped tensor byte, is an error, not a different result.

Older files: format 2 (tensor checksum, no header checksum) still loads with its tensor checksum
verified; its header cannot be checked, and a load without ``model_fingerprint`` marks the result
as of unknown identity (:data:`capinterp.units.saved.IDENTITY_UNKNOWN`). Format 1 files have no
checksum at all and load as they are. Re-saving a loaded result (``obj.save(path, overwrite=True)``)
writes format 3. A format 3 file without both checksums is refused as damaged.

Saving never replaces by accident: an existing file must be a capinterp file of the same type, an
existing folder empty or a saved folder of the same type, unless ``overwrite=True``; every file is
written atomically (:func:`capinterp.units.saved.save_bytes`).

This module knows bytes and headers only; :mod:`capinterp.units.neuron_tensor` turns them into objects.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
from safetensors import safe_open
from safetensors.torch import save as safetensors_bytes
from torch import Tensor

from capinterp.core.atomic import write_atomic
from capinterp.units.saved import digest, save_bytes

__all__ = ["FORMAT_VERSION", "Header", "check_target", "checksum", "read", "write"]

FORMAT_VERSION = 3  # 2: tensor checksum; 3: header checksum over the whole header
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


def stored_type(p: Path) -> str | None:
    """The type recorded in a saved capinterp file / folder, None when it is not one."""
    from capinterp.units.saved import stored_type as file_type

    if not p.is_dir():
        return file_type(p)
    try:
        return str(json.loads((p / META_FILE).read_text())["type"])
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


def write(p: Path, as_folder: bool, name: str, stored: Tensor, header: Header, *, overwrite: bool = False) -> Path:
    """Write one tensor ``name`` and its header (``format_version`` and both checksums added) atomically;
    ValueError (before writing) for a target that is not a saved ``header["type"]``, unless ``overwrite``."""
    mine = str(header["type"])
    if as_folder and p.is_symlink():
        raise ValueError(f"{p} is a link to a folder; save to the folder itself ({p.resolve()}) or to a file path")
    if as_folder and not overwrite:
        check_target(p, True, mine)
    plain = json.loads(
        json.dumps({**header, "format_version": FORMAT_VERSION, "checksum": checksum(stored)}, default=_json_default)
    )
    blob = json.dumps({**plain, "header_checksum": digest(plain)}, sort_keys=True)
    data = safetensors_bytes({name: stored}, metadata={"capinterp": blob})
    if as_folder:
        p.mkdir(parents=True, exist_ok=True)
        write_atomic(p / TENSOR_FILE, data)
        write_atomic(p / META_FILE, blob)
        return p
    return save_bytes(p, data, mine, overwrite=overwrite)


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
        full = json.loads(blob)  # type: ignore[arg-type]
        header = {k: full[k] for k in ("type", "format_version", "shape", "meta")}
    except (ValueError, KeyError, TypeError) as e:
        raise invalid(p, f"bad metadata ({type(e).__name__}: {e})") from e
    return _checked_header(p, full, header), tensors


def _checked_header(p: Path, full: dict[str, Any], header: Header) -> Header:
    """``header`` with ``checksum`` when recorded, after verifying the header checksum (when present,
    and required from format 3 on)."""
    recorded = full.pop("header_checksum", None)
    version = full.get("format_version")
    if isinstance(version, int) and 3 <= version <= FORMAT_VERSION and (recorded is None or "checksum" not in full):
        raise invalid(p, f"format {version} file without its checksums (edited or damaged metadata)")
    if recorded is not None and recorded != digest(full):
        raise invalid(
            p,
            "its metadata does not match its header checksum: a field (model, fingerprint, method, "
            "parameters, shape, ...) was edited or damaged; locate it again, or restore the original file",
        )
    return header | ({"checksum": full["checksum"]} if "checksum" in full else {})
