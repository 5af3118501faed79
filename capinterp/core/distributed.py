"""Data parallel over processes with ``torch.distributed``: started by ``torchrun``, no code change.

Under ``torchrun --nproc-per-node N`` (``WORLD_SIZE`` > 1 in the environment), the first call
of :func:`init` joins the process group from torchrun's variables (gloo for CPU models, NCCL
for CUDA ones); without torchrun every function here is a no-op on one process (rank 0 of 1).
Dataset-level methods shard their examples by rank (:func:`shard`), all-reduce float64 score
sums (:func:`all_reduce_sum`) and gather per-example records (:func:`gather`), so every rank
ends with the one-process result; only rank 0 (:func:`is_main`) writes files and shows progress.
(EleutherAI's knowledge-neurons shards prompts over GPUs too, but never reduces their scores.)
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, TypeVar

import torch
import torch.distributed as dist

__all__ = [
    "active",
    "all_reduce_sum",
    "barrier",
    "finish",
    "gather",
    "gather_indexed",
    "init",
    "is_main",
    "launched",
    "rank",
    "rank_path",
    "shard",
    "world_size",
]

T = TypeVar("T")


def launched() -> bool:
    """Whether this process was started by torchrun (or another launcher) with more than one rank."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def init(device: Any = "cpu") -> bool:
    """Join the process group when launched with several ranks; returns whether one is active.

    ``device``: where the tensors to reduce live; a CUDA device selects NCCL, anything else gloo.
    """
    if dist.is_available() and dist.is_initialized():
        return True
    if not launched():
        return False
    if not dist.is_available():
        raise RuntimeError("WORLD_SIZE > 1 but this torch build has no torch.distributed")
    cuda = torch.device(device).type == "cuda"
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend="nccl" if cuda else "gloo")
    return True


def active() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank() -> int:
    return dist.get_rank() if active() else 0


def world_size() -> int:
    return dist.get_world_size() if active() else 1


def is_main() -> bool:
    """True on rank 0 (and in a single process): the rank that writes results and shows progress."""
    return rank() == 0


def shard(items: Sequence[T]) -> list[T]:
    """This rank's share: items ``rank, rank + world, ...`` (all of them on one process)."""
    return list(items[rank() :: world_size()])


def all_reduce_sum(t: torch.Tensor, device: Any = "cpu") -> torch.Tensor:
    """Sum of ``t`` over ranks (same shape, same dtype, on ``t``'s device); ``t`` itself on one process."""
    if not active():
        return t
    work = t.to(device if dist.get_backend() == "nccl" else "cpu").contiguous().clone()
    dist.all_reduce(work, op=dist.ReduceOp.SUM)
    return work.to(t.device)


def gather(obj: Any) -> list[Any]:
    """Every rank's ``obj`` (picklable), in rank order; ``[obj]`` on one process."""
    if not active():
        return [obj]
    out: list[Any] = [None] * world_size()
    dist.all_gather_object(out, obj)
    return out


def gather_indexed(pairs: Sequence[tuple[int, T]]) -> list[T]:
    """Every rank's ``(index, item)`` pairs merged and ordered by index: the items a single process
    would have produced, in its order."""
    return [item for _, item in sorted((p for part in gather(list(pairs)) for p in part), key=lambda p: p[0])]


def rank_path(path: str | None) -> str | None:
    """This rank's checkpoint file: ``path`` itself on one process, ``path.rank<r>-of-<n>`` under torchrun."""
    if path is None or world_size() == 1:
        return path
    return f"{path}.rank{rank()}-of-{world_size()}"


def barrier() -> None:
    if active():
        dist.barrier()


def finish() -> None:
    """Leave the process group (end of a torchrun'd command); no-op otherwise."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
