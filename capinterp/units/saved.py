"""What every saved result shares: one save routine, the header digest, and the model-identity rule.

* :func:`save_bytes` is the one way a result (NeuronScores, NeuronSet, Circuit) reaches the disk:
  atomically (:func:`capinterp.core.atomic.write_atomic`: temporary file beside the target, fsync,
  rename; a link at the target is replaced, never followed) and only over a saved result of the
  same type unless ``overwrite=True``.
* :func:`digest` is the SHA-256 of a JSON value in one canonical spelling (sorted keys, no spaces):
  a file's checksum covers its whole header this way, so an edited field is caught on load.
* A result loaded from a file that records no model identity (no ``model_fingerprint``) carries
  ``meta["identity_unknown"]`` (the file's path): applying it to a model (erase, amplify,
  faithfulness, hit@k, loading with ``model=``) is refused unless ``across_models=True``, as for
  a result of another checkpoint. Results built in memory (a hand-made set) are not affected.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from capinterp.core.atomic import write_atomic

__all__ = ["IDENTITY_UNKNOWN", "check_identity", "check_model_identity", "digest", "save_bytes", "stored_type"]

IDENTITY_UNKNOWN = "identity_unknown"
_MAX_JSON = 1 << 30  # a larger file is not read to learn its type: it is no saved circuit


def digest(value: Any) -> str:
    """SHA-256 of ``value`` written as canonical JSON (sorted keys, ``,``/``:`` separators)."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode("ascii")).hexdigest()


def stored_type(p: Path) -> str | None:
    """The result type recorded in the file ``p`` (a ``.capi`` file or a saved circuit's JSON), None
    when it is none of them."""
    try:
        from safetensors import safe_open

        with safe_open(str(p), framework="pt") as f:
            blob = (f.metadata() or {}).get("capinterp")
        return str(json.loads(blob)["type"]) if blob else None
    except Exception:
        pass
    try:
        if p.stat().st_size > _MAX_JSON:
            return None
        d = json.loads(p.read_bytes())
        return str(d["type"]) if isinstance(d, dict) and isinstance(d.get("type"), str) else None
    except Exception:
        return None


def _same_type_only(mine: str):
    def check(p: Path) -> None:
        kind = stored_type(p)
        if kind != mine:
            what = f"a saved {kind}" if kind else "a file that is not a capinterp file"
            link = (
                f" (a link to {os.readlink(p)}; the link would be replaced, its target kept)" if p.is_symlink() else ""
            )
            raise ValueError(
                f"{p} is {what}{link}; saving a {mine} there would replace it: choose another path or pass overwrite=True"
            )

    return check


def save_bytes(path: str | os.PathLike, data: bytes | str, mine: str, *, overwrite: bool = False) -> Path:
    """Write a saved ``mine`` (its type name) to ``path`` atomically; ValueError if ``path`` holds
    anything but a saved ``mine`` and ``overwrite`` is False (see the module docstring)."""
    return write_atomic(path, data, overwrite_ok=True if overwrite else _same_type_only(mine))


def check_identity(
    meta: Mapping[str, Any],
    what: str,
    *,
    fingerprint: str | None = None,
    architecture: str | None = None,
    model_name: str | None = None,
) -> None:
    """ValueError when a result with metadata ``meta`` was made for another model: its
    ``model_fingerprint`` differs from ``fingerprint`` or its ``architecture_fingerprint`` from
    ``architecture`` (each checked when both are known), or ``fingerprint`` is given and the result
    was loaded from a file without any model identity (``meta["identity_unknown"]``)."""
    if fingerprint is not None and meta.get("model_fingerprint") is None and meta.get(IDENTITY_UNKNOWN):
        raise ValueError(
            f"this {what} was loaded from {meta[IDENTITY_UNKNOWN]}, which records no model identity "
            f"(model_fingerprint): it cannot be checked against model {model_name!r}; pass across_models=True "
            "to apply it anyway, or locate it again on this model and save that"
        )
    for key, theirs, kind in (
        ("model_fingerprint", fingerprint, "weights or config"),
        ("architecture_fingerprint", architecture, "architecture"),
    ):
        mine = meta.get(key)
        if theirs is not None and mine is not None and str(theirs) != str(mine):
            hint = (
                "; if this model is another checkpoint of the same architecture on purpose, pass across_models=True"
                if key == "model_fingerprint"
                else ""
            )
            raise ValueError(
                f"{what} was made for model {meta.get('model')!r} ({key} {mine!r}); this "
                f"model {model_name!r} has {key} {theirs!r}: their {kind} differ{hint}"
            )


def check_model_identity(meta: Mapping[str, Any], what: str, model: Any, across_models: bool) -> None:
    """:func:`check_identity` of a result against a loaded ``model``: its model fingerprint, or with
    ``across_models=True`` (another checkpoint of the same architecture, on purpose) its architecture."""
    from capinterp.arch.model import architecture_fingerprint, model_fingerprint
    from capinterp.core import validate

    name = getattr(model, "capinterp_name", None)
    if validate.boolean("across_models", across_models):
        check_identity(meta, what, architecture=architecture_fingerprint(model), model_name=name)
    else:
        check_identity(meta, what, fingerprint=model_fingerprint(model), model_name=name)
