"""Memory planning: free memory on a device, ``batch_size="auto"``, out-of-memory detection.

``auto_batch_size(device, row_bytes)`` is the largest power of two ``b`` with
``b * row_bytes <= fraction * free`` (clamped to ``[1, cap]``), where ``free`` is
``torch.cuda.mem_get_info`` on a GPU and the available system memory on the CPU. The
per-row estimates come from each method (CNL: :func:`ig_row_bytes`; DCSN: :func:`forward_row_bytes`)
and are deliberately generous; an out-of-memory error that still happens is caught by the
dataset localizers, which halve the batch and redo the same work.
"""

from __future__ import annotations

import gc
import os
from typing import Any

import torch

from capinterp.core.protocol import Model

__all__ = ["auto_batch_size", "forward_row_bytes", "free_bytes", "ig_row_bytes", "is_oom", "peak_bytes", "release"]


def free_bytes(device: Any) -> int:
    """Bytes free for new tensors on ``device`` (CUDA: driver's free memory; CPU: available RAM)."""
    dev = torch.device(device)
    if dev.type == "cuda":
        return int(torch.cuda.mem_get_info(dev)[0])
    if dev.type == "mps" and hasattr(torch, "mps"):
        return int(torch.mps.recommended_max_memory() - torch.mps.current_allocated_memory())
    return _available_ram()


def _available_ram() -> int:
    """``MemAvailable`` from /proc/meminfo (Linux), else free pages via ``os.sysconf``."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def auto_batch_size(device: Any, row_bytes: int, *, fraction: float = 0.5, cap: int = 1024) -> int:
    """Largest power of two ``<= cap`` whose rows fit in ``fraction`` of the free memory (>= 1)."""
    if row_bytes <= 0:
        raise ValueError(f"row_bytes must be > 0, got {row_bytes}")
    fit = int(fraction * free_bytes(device) // row_bytes)
    b = 1
    while b * 2 <= min(fit, cap):
        b *= 2
    return b


def _elem(model: Model) -> int:
    return torch.finfo(next(model.parameters()).dtype).bits // 8


def ig_row_bytes(model: Model, seq_len: int, n_read: int) -> int:
    """Peak bytes per IG row (one layer x step point, forward + backward over ``seq_len`` tokens).

    Activations kept for the backward: ~(10 d_model + 4 d_mlp) per token per block in the model's
    dtype, plus float32 logits (and their gradient) at the ``n_read`` answer positions.
    """
    cfg = model.cfg
    acts = int(cfg.n_layers) * seq_len * (10 * int(cfg.d_model) + 4 * int(cfg.d_mlp)) * _elem(model)
    return acts + 3 * n_read * int(cfg.d_vocab) * 4


def forward_row_bytes(model: Model, seq_len: int) -> int:
    """Peak bytes per row of a no-grad forward: the widest transient (MLP) plus the kept last-token
    activations of every layer and one row of float32 logits."""
    cfg = model.cfg
    transient = seq_len * (4 * int(cfg.d_model) + 3 * int(cfg.d_mlp)) * _elem(model)
    return transient + int(cfg.n_layers) * int(cfg.d_mlp) * 4 * 2 + int(cfg.d_vocab) * 4 * 2


def is_oom(err: BaseException) -> bool:
    """Whether ``err`` is an out-of-memory error (CUDA, MPS or a failed CPU allocation)."""
    if isinstance(err, torch.OutOfMemoryError):
        return True
    text = str(err)
    return isinstance(err, RuntimeError) and ("out of memory" in text or "DefaultCPUAllocator: can't allocate" in text)


def release(device: Any) -> None:
    """Return cached blocks after an out-of-memory error, so the retry starts from a clean pool."""
    gc.collect()
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()


def peak_bytes(device: Any) -> int | None:
    """Peak allocated bytes on a CUDA device since the last reset; None elsewhere."""
    dev = torch.device(device)
    return int(torch.cuda.max_memory_allocated(dev)) if dev.type == "cuda" else None
