"""Data parallel over processes with ``torch.distributed``: started by ``torchrun``, no code change.

Under ``torchrun --nproc-per-node N`` (``WORLD_SIZE`` > 1 in the environment), the first call
of :func:`init` joins the process group from torchrun's variables (gloo for CPU models, NCCL
for CUDA ones); without torchrun every function here is a no-op on one process (rank 0 of 1).
Dataset-level methods shard their examples by rank (:func:`shard`), all-reduce float64 score
sums (:func:`all_reduce_sum`) and gather per-example records (:func:`gather`), so every rank
ends with the one-process result; only rank 0 (:func:`is_main`) writes files and shows progress.
(EleutherAI's knowledge-neurons shards prompts over GPUs too, but never reduces their scores.)

Faults: every collective waits at most :func:`timeout_seconds` (``init(timeout=)``, else the
environment variable ``CAPINTERP_DIST_TIMEOUT``, else 30 minutes) for the other ranks; a rank
that does not answer in time (hung, stopped, killed) makes the collective raise
:class:`RankFailure`, naming the collective, the silent rank(s) where the store tells them, and
what to do. (gloo raises after the timeout; NCCL's watchdog aborts the process after it.)
"""

from __future__ import annotations

import glob
import math
import os
import re
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.distributed as dist

__all__ = [
    "DEFAULT_TIMEOUT",
    "TIMEOUT_ENV",
    "RankFailure",
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
    "rank_files",
    "rank_path",
    "shard",
    "timeout_seconds",
    "world_size",
]

T = TypeVar("T")

#: Seconds a collective waits for every rank by default: long, since one chunk of a slow method on
#: a CPU can legitimately take minutes before a rank reaches the next collective.
DEFAULT_TIMEOUT = 1800.0
#: Environment variable that sets the timeout in seconds (``init(timeout=)`` wins over it).
TIMEOUT_ENV = "CAPINTERP_DIST_TIMEOUT"
#: Store key prefix under which each rank records the number of the collective it last entered.
_PROGRESS = "capinterp/collective/"

_timeout: float | None = None  # the process group's timeout, when init() created the group
_seq = 0  # collectives this rank has entered (every rank calls the same ones, in the same order)


class RankFailure(RuntimeError):
    """A collective failed under torchrun: a rank did not answer within the timeout (hung, stopped,
    swapping), or stopped answering (killed, crashed). The message names the collective and what to do."""


def timeout_seconds(timeout: float | None = None) -> float:
    """The collective timeout in seconds: ``timeout``, else ``$CAPINTERP_DIST_TIMEOUT``, else
    :data:`DEFAULT_TIMEOUT`; ValueError unless it is a finite number > 0."""
    source = "timeout"
    if timeout is None:
        raw = os.environ.get(TIMEOUT_ENV, "").strip()
        if not raw:
            return DEFAULT_TIMEOUT
        source = f"${TIMEOUT_ENV}"
        try:
            timeout = float(raw)
        except ValueError:
            timeout = math.nan
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not math.isfinite(timeout) or timeout <= 0:
        raise ValueError(
            f"{source}={timeout if source == 'timeout' else raw!r}: give the seconds a collective waits "
            f"for every rank under torchrun, a number > 0 (default {DEFAULT_TIMEOUT:g})"
        )
    return float(timeout)


def launched() -> bool:
    """Whether this process was started by torchrun (or another launcher) with more than one rank."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def init(device: Any = "cpu", timeout: float | None = None) -> bool:
    """Join the process group when launched with several ranks; returns whether one is active.

    ``device``: where the tensors to reduce live; a CUDA device selects NCCL, anything else gloo.
    ``timeout``: seconds a collective waits for every rank (:func:`timeout_seconds`); a group that
    already exists keeps its own.
    """
    global _timeout
    seconds = timeout_seconds(timeout)  # a bad value is refused on one process too
    if dist.is_available() and dist.is_initialized():
        return True
    if not launched():
        return False
    if not dist.is_available():
        raise RuntimeError("WORLD_SIZE > 1 but this torch build has no torch.distributed")
    cuda = torch.device(device).type == "cuda"
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend="nccl" if cuda else "gloo", timeout=timedelta(seconds=seconds))
    _timeout = seconds
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
    _collective("all_reduce (sum)", dist.all_reduce, work, op=dist.ReduceOp.SUM)
    return work.to(t.device)


def gather(obj: Any) -> list[Any]:
    """Every rank's ``obj`` (picklable), in rank order; ``[obj]`` on one process."""
    if not active():
        return [obj]
    out: list[Any] = [None] * world_size()
    _collective("all_gather_object", dist.all_gather_object, out, obj)
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


_RANK_SUFFIX = re.compile(r"\.rank(\d+)-of-(\d+)")


def rank_files(path: str) -> list[tuple[str, int, int]]:
    """The checkpoint files of ``path`` that exist, whatever number of ranks wrote them:
    ``(file, rank, world_size)``, ``path`` itself as ``(path, 0, 1)``; ordered by world size, then rank."""
    base = Path(path)
    out = [(str(base), 0, 1)] if base.is_file() else []
    if base.parent.is_dir():
        for f in base.parent.glob(glob.escape(base.name) + ".rank*-of-*"):
            m = _RANK_SUFFIX.fullmatch(f.name[len(base.name) :])
            if m and f.is_file() and 0 <= int(m[1]) < int(m[2]) and int(m[2]) > 1:
                out.append((str(f), int(m[1]), int(m[2])))
    return sorted(out, key=lambda t: (t[2], t[1]))


def barrier() -> None:
    if active():
        _collective("barrier", dist.barrier)


def finish() -> None:
    """Leave the process group (end of a torchrun'd command); no-op otherwise."""
    global _timeout
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    _timeout = None


# -- faults -------------------------------------------------------------------------------
def _store() -> Any:
    try:
        return dist.distributed_c10d._get_default_store()
    except Exception:  # a group created without a store we can reach: no progress marks
        return None


def _collective(what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run collective ``fn``; a backend error (timeout, lost peer) becomes a :class:`RankFailure`."""
    global _seq
    _seq += 1
    store = _store()
    if store is not None:
        try:
            store.set(f"{_PROGRESS}{rank()}", str(_seq))
        except Exception:
            store = None
    try:
        return fn(*args, **kwargs)
    except RuntimeError as err:  # gloo/NCCL errors (DistBackendError, ...) are RuntimeErrors
        raise RankFailure(_explain(what, err, store)) from err


def _behind(store: Any) -> list[int]:
    """The ranks that have not entered this rank's current collective (from their progress marks)."""
    late = []
    for r in range(world_size()):
        key = f"{_PROGRESS}{r}"
        try:
            seen = int(store.get(key)) if store.check([key]) else 0
        except Exception:
            return []
        if r != rank() and seen < _seq:
            late.append(r)
    return late


def _explain(what: str, err: RuntimeError, store: Any) -> str:
    """A message for a failed collective: which one, who, how long, and what to check."""
    late = _behind(store) if store is not None else []
    who = (f"rank {late[0]}" if len(late) == 1 else f"ranks {late}") if late else "another rank"
    first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    resume = "rerunning the same command resumes from the checkpoints (checkpoint=), if the run keeps any"
    head = f"rank {rank()} of {world_size()}: collective #{_seq} ({what}) failed: "
    if "timed out" in first.lower() or "timeout" in first.lower():
        limit = f"{_timeout:g} s" if _timeout is not None else "the process group's timeout"
        return (
            f"{head}{who} did not answer within {limit}; a rank may be hung (stopped, swapping, "
            f"deadlocked) or killed. Check that every rank is alive; if one chunk of work legitimately "
            f"takes longer, raise ${TIMEOUT_ENV} (seconds); {resume}. [{first}]"
        )
    return (
        f"{head}{who} stopped answering; it was probably killed or crashed (see its error in "
        f"torchrun's output); {resume}. [{first}]"
    )
