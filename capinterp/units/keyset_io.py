"""A :class:`~capinterp.units.base.KeySet` on disk: one JSON file (layers, experts, edges, nodes).

The file holds the set's ``kind``, ``space``, keys, parameter accounting and ``meta`` (the model
identity a localizer records: ``model``, ``model_fingerprint``, ...), plus a SHA-256 ``checksum``
over all of it (:func:`capinterp.units.saved.digest`), so an edited or damaged file is refused on
load. It is written atomically, and never over another kind of file unless ``overwrite=True``
(:func:`capinterp.units.saved.save_bytes`).

Keys and the space are hashable values that JSON cannot all spell (a tuple reads back as a list),
so each is written in a tagged form that reads back to an equal value of the same type:
``None`` / ``bool`` / ``int`` / finite ``float`` / ``str`` as themselves, a tuple as
``{"tuple": [...]}``, a frozenset as ``{"frozenset": [...]}`` (nested freely). Anything else is a
TypeError at save time, before the file is touched.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Hashable, Mapping
from pathlib import Path
from typing import Any

from capinterp.units.saved import IDENTITY_UNKNOWN, digest, save_bytes

__all__ = ["FORMAT_VERSION", "decode_key", "encode_key", "read_keyset", "write_keyset"]

#: Version of the saved-KeySet layout (1: the first).
FORMAT_VERSION = 1
_TYPE = "KeySet"
_FIELDS = ("type", "format_version", "kind", "space", "keys", "unit_params", "n_params", "n_units", "meta")


def encode_key(value: Any) -> Any:
    """``value`` (a hashable key or space) as JSON that :func:`decode_key` reads back exactly."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"a non-finite float key ({value!r}) cannot be saved")
        return value
    if isinstance(value, tuple):
        return {"tuple": [encode_key(v) for v in value]}
    if isinstance(value, frozenset):
        return {"frozenset": sorted((encode_key(v) for v in value), key=_canonical)}
    raise TypeError(
        f"a key of type {type(value).__name__} ({value!r:.60}) cannot be saved: keys are None, bool, int, "
        "float, str, or tuples / frozensets of them"
    )


def decode_key(value: Any) -> Hashable:
    """The key :func:`encode_key` wrote; ValueError for anything it never writes."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, dict) and len(value) == 1:
        ((tag, items),) = value.items()
        if tag in ("tuple", "frozenset") and isinstance(items, list):
            parts = [decode_key(v) for v in items]
            return tuple(parts) if tag == "tuple" else frozenset(parts)
    raise ValueError(f"not a saved key: {value!r:.60}")


def _canonical(encoded: Any) -> str:
    return json.dumps(encoded, sort_keys=True, separators=(",", ":"))


def _content(ks: Any) -> dict[str, Any]:
    """The file's fields (checksum excluded) for the KeySet ``ks``; TypeError / ValueError for a key,
    a space or metadata that cannot be written."""
    up = ks.unit_params
    if isinstance(up, Mapping):
        unit_params: Any = sorted(([encode_key(k), int(v)] for k, v in up.items()), key=_canonical)
    else:
        unit_params = None if up is None else int(up)
    try:
        meta = json.loads(json.dumps(dict(ks.meta), allow_nan=False, default=_plain))
    except ValueError as err:
        raise ValueError(f"the KeySet's meta cannot be saved as JSON: {err}") from err
    return {
        "type": _TYPE,
        "format_version": FORMAT_VERSION,
        "kind": ks.kind,
        "space": encode_key(ks.space),
        "keys": sorted((encode_key(k) for k in ks), key=_canonical),
        "unit_params": unit_params,
        "n_params": None if ks.n_params is None else int(ks.n_params),
        "n_units": None if ks.n_units is None else int(ks.n_units),
        "meta": meta,
    }


def _plain(o: Any) -> Any:
    return o.tolist() if hasattr(o, "tolist") else str(o)


def write_keyset(ks: Any, path: str | os.PathLike, *, overwrite: bool = False) -> Path:
    """Write ``ks`` to ``path`` (see the module docstring); returns the path."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or Path, got {type(path).__name__}")
    d = _content(ks)  # every key checked before the file is touched
    return save_bytes(path, json.dumps({**d, "checksum": digest(d)}, sort_keys=True), _TYPE, overwrite=overwrite)


def _whole(name: str, v: Any, *, optional: bool = True) -> int | None:
    if v is None and optional:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ValueError(f"{name} must be a whole number, got {v!r:.40}")
    return v


def read_keyset(path: str | os.PathLike) -> dict[str, Any]:
    """The constructor arguments of the KeySet saved at ``path``: ``keys``, ``kind``, ``space``,
    ``unit_params``, ``n_params``, ``n_units``, ``meta`` (marked :data:`IDENTITY_UNKNOWN` when it
    records no ``model_fingerprint``). FileNotFoundError when there is no file; ValueError naming
    the path for a file that is not a saved KeySet, a newer format, or one whose checksum fails."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"no saved KeySet at {p}")
    try:
        return _parse(json.loads(p.read_bytes()), p)
    except (ValueError, TypeError, UnicodeDecodeError) as err:  # json's decode errors are ValueErrors
        raise ValueError(f"{p} is not a valid saved KeySet: {err}") from err


def _parse(d: Any, p: Path) -> dict[str, Any]:
    if not isinstance(d, dict) or d.get("type") != _TYPE:
        raise ValueError(f"it holds type {d.get('type') if isinstance(d, dict) else type(d).__name__!r:.40}")
    d = dict(d)
    recorded = d.pop("checksum", None)
    version = _whole("format_version", d.get("format_version"), optional=False)
    if version is not None and version > FORMAT_VERSION:
        raise ValueError(f"format_version {version} is newer than {FORMAT_VERSION}: upgrade capinterp")
    if recorded is None or recorded != digest(d):
        raise ValueError("its content does not match its checksum (edited or damaged); locate the units again")
    missing = [f for f in _FIELDS if f not in d]
    if missing or set(d) - set(_FIELDS):
        raise ValueError(f"unexpected fields (missing {missing}, extra {sorted(set(d) - set(_FIELDS))})")
    if not isinstance(d["kind"], str) or not isinstance(d["keys"], list) or not isinstance(d["meta"], dict):
        raise ValueError("kind must be a string, keys a list and meta an object")
    up = d["unit_params"]
    if isinstance(up, list):
        unit_params: Any = {decode_key(k): _whole("unit_params", v) for k, v in up}
    else:
        unit_params = _whole("unit_params", up)
    meta = dict(d["meta"])
    if meta.get("model_fingerprint") is None:
        meta[IDENTITY_UNKNOWN] = str(p)
    return {
        "keys": [decode_key(k) for k in d["keys"]],
        "kind": d["kind"],
        "space": decode_key(d["space"]),
        "unit_params": unit_params,
        "n_params": _whole("n_params", d["n_params"]),
        "n_units": _whole("n_units", d["n_units"]),
        "meta": meta,
    }
