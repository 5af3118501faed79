"""Runtime settings that must be explicit, never read from global config at import time."""
from __future__ import annotations

import os

import torch


def set_threads(n: int | None) -> int:
    """Set torch's intra-op thread count and return the value in force.

    ``None`` leaves torch's current setting (or ``CAPINTERP_THREADS`` when set) in place.
    On small shared CPUs, 1-2 threads are usually fastest; tests use 1.
    """
    if n is None:
        env = os.environ.get("CAPINTERP_THREADS")
        if env:
            n = int(env)
    if n is not None:
        if n < 1:
            raise ValueError(f"threads must be >= 1, got {n}")
        torch.set_num_threads(n)
    return torch.get_num_threads()


def resolve_device(device: str | torch.device | None) -> torch.device:
    """``None`` -> cpu; anything else is passed to ``torch.device`` (``"cuda"``, ``"cuda:1"``, ``"mps"``)."""
    return torch.device("cpu" if device is None else device)
