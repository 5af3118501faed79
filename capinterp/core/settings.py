"""Runtime settings that must be explicit, never read from global config at import time."""

from __future__ import annotations

import os

import torch

__all__ = ["DTYPES", "resolve_device", "resolve_dtype", "set_threads"]


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
    """Check ``device`` and return it as a ``torch.device``; nothing is moved or changed.

    ``None`` -> cpu. ``"cuda"`` under ``torchrun`` (``LOCAL_RANK`` set, ``WORLD_SIZE`` > 1) means
    this process's own GPU, ``cuda:LOCAL_RANK``. Refused with a ValueError naming the value: a
    string torch cannot parse, ``"meta"`` (it would drop the weights), a CUDA / MPS / XPU device
    when this torch build or machine has none, and a device index beyond the devices present.
    Callers validate here *before* touching a model, so a bad device never leaves it half-moved.
    """
    if device is None:
        return torch.device("cpu")
    if not isinstance(device, (str, torch.device)):
        raise TypeError(
            f"device must be a string like 'cpu', 'cuda', 'cuda:1', 'mps' or a torch.device, got {device!r}"
        )
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError) as err:
        raise ValueError(
            f"device {device!r} is not a device torch knows ({err}); use 'cpu', 'cuda', 'cuda:1', 'mps'"
        ) from None
    if dev.type == "meta":
        raise ValueError(
            "device 'meta' holds no data: moving a model there would drop its weights; use 'cpu' or 'cuda'"
        )
    if dev.type == "cpu":
        return dev
    if dev.type == "cuda" and dev.index is None and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    backend = {"cuda": torch.cuda, "mps": getattr(torch.backends, "mps", None)}.get(
        dev.type, getattr(torch, dev.type, None)
    )
    available = getattr(backend, "is_available", None)
    if available is None or not available():
        raise ValueError(
            f"device {device!r} is not available here: this machine / torch build has no {dev.type} device; use 'cpu'"
        )
    count = getattr(backend, "device_count", lambda: 1)()
    if dev.index is not None and dev.index >= count:
        raise ValueError(
            f"device {device!r} does not exist: {count} {dev.type} device(s) present (indices 0..{count - 1})"
        )
    return dev


DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float64": torch.float64,
}


def resolve_dtype(dtype: str | torch.dtype | None) -> torch.dtype | None:
    """``None`` -> None (keep); a floating torch dtype or its name (``"bfloat16"``, ``"bf16"``, ...)."""
    if dtype is None or (isinstance(dtype, torch.dtype) and dtype in DTYPES.values()):
        return dtype
    if isinstance(dtype, str):
        name = {
            "bf16": "bfloat16",
            "fp16": "float16",
            "half": "float16",
            "fp32": "float32",
            "float": "float32",
            "fp64": "float64",
            "double": "float64",
        }.get(dtype.lower(), dtype.lower().removeprefix("torch."))
        if name in DTYPES:
            return DTYPES[name]
    raise ValueError(f"dtype must be one of {', '.join(DTYPES)} (a name or torch dtype), got {dtype!r}")
