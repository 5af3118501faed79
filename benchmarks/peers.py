"""Shared pieces of the side-by-side peer benchmarks (``bench_vs_captum.py``, ``bench_vs_kn.py``,
``bench_vs_tl_eap.py``): prompts, module lookup, agreement measures and the printed table.

The peers are optional (``pip install --no-deps`` of the ``peers`` extra, never by setup.sh);
:func:`require` says how to get one that is missing before any model loads.
"""

from __future__ import annotations

import importlib
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from capinterp.core.example import Example

#: Short single-token-answer facts (a subject for EAP's swap corruption).
FACTS = [
    Example("The Eiffel Tower is located in the city of", " Paris", {"subject": "The Eiffel Tower"}),
    Example("The Colosseum is located in the city of", " Rome", {"subject": "The Colosseum"}),
    Example("The Brandenburg Gate is located in the city of", " Berlin", {"subject": "The Brandenburg Gate"}),
    Example("The Space Needle is located in the city of", " Seattle", {"subject": "The Space Needle"}),
]


def require(module: str, hint: str) -> Any:
    """Import an optional peer or exit with a clear message (before any long work)."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise SystemExit(f"{module} is not installed ({e}); {hint}") from None


def hf_module(hf: torch.nn.Module, layer: int, suffix: str) -> torch.nn.Module:
    """The module named ``...layers.{layer}.{suffix}`` (or GPT-2's ``...h.{layer}.{suffix}``) of an HF model."""
    for name, mod in hf.named_modules():  # first match: TransformerBridge's wrapper, not its inner module
        name = "." + name.replace("_original_component.", "")
        if any(name.endswith(f".{stem}.{layer}.{suffix}") for stem in ("layers", "h")):
            return mod
    raise ValueError(f"no module '*layers.{layer}.{suffix}' in {type(hf).__name__}")


def spearman(a: torch.Tensor, b: torch.Tensor) -> float:
    """Rank correlation of two flat score vectors (ties broken by position)."""

    def ranks(x: torch.Tensor) -> torch.Tensor:
        r = torch.empty(x.numel(), dtype=torch.float64)
        r[x.flatten().argsort()] = torch.arange(x.numel(), dtype=torch.float64)
        return r - r.mean()

    x, y = ranks(a), ranks(b)
    return float(x @ y / (x.norm() * y.norm()))


def agreement(ours: torch.Tensor, theirs: torch.Tensor) -> dict[str, float]:
    """max |diff|, max |diff| / max |theirs| and Spearman over all scores compared."""
    ours, theirs = ours.double().flatten(), theirs.double().flatten()
    if ours.shape != theirs.shape:
        raise ValueError(f"score shapes differ: {tuple(ours.shape)} vs {tuple(theirs.shape)}")
    diff = (ours - theirs).abs().max().item()
    return {"max_abs": diff, "rel": diff / max(theirs.abs().max().item(), 1e-30), "spearman": spearman(ours, theirs)}


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def report(peer: str, what: str, agree: dict[str, float], t_ours: float, t_peer: float) -> str:
    """The printed table: agreement, both times and their ratio (peer / capinterp)."""
    rows = [
        f"peer: {peer}",
        f"compared: {what}",
        f"agreement: max |diff| {agree['max_abs']:.2e} (relative to max |score| {agree['rel']:.2e}), "
        f"Spearman {agree['spearman']:.6f}",
        f"{'':20s}{'seconds':>10s}",
        f"{'capinterp':20s}{t_ours:10.2f}",
        f"{peer.split()[0]:20s}{t_peer:10.2f}",
        f"ratio (peer / capinterp): {t_peer / t_ours:.1f}x; load average {os.getloadavg()[0]:.1f}",
    ]
    return "\n".join(rows)
