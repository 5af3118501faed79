"""Resume a dataset fit from checkpoints written by any number of ranks (:mod:`capinterp.core.distributed`).

A dataset fit under ``torchrun --nproc-per-node N`` checkpoints rank ``r``'s shard to
``path.rank<r>-of-<N>`` (``path`` itself on one process). Each file holds float64 sums over the
examples it lists as done, keyed by the computation, so files written with another number of
processes merge exactly: :func:`resume` gives rank 0 their sums (and per-example records), tells
every rank which examples are done anywhere, writes the merge into this run's own file and then
deletes the adopted ones. A rerun with 1 process after 2 (or 2 after 1) thus continues where the
other stopped instead of starting from scratch; files that overlap (two partial runs over the same
examples) cannot be merged without counting examples twice and are refused, naming them.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from capinterp.core import distributed as dist
from capinterp.kernels.accumulate import ScoreSum

__all__ = ["merge_shards", "resume"]


def merge_shards(shape: tuple[int, ...], key: dict, parts: list[ScoreSum]) -> ScoreSum:
    """Disjoint shards of one computation in one ScoreSum, with their ``extra`` tensors (per-example
    rows, e.g. ``records.*``) concatenated in the order given; extras that not every non-empty shard
    has are dropped (a shard saved before they were kept)."""
    out = ScoreSum(shape, key)
    full = [p for p in parts if p.done]
    for p in full:
        clash = out.done & p.done
        if clash:
            raise ValueError(f"checkpoint shards overlap on examples {sorted(clash)[:5]}")
        out.sum += p.sum
        out.done |= p.done
    names = set.intersection(*(set(p.extra) for p in full)) if full else set()
    try:
        out.extra = {k: torch.cat([p.extra[k] for p in full]) for k in sorted(names)}
    except RuntimeError as err:
        raise ValueError(f"checkpoint shards keep extra tensors that do not stack: {err}") from err
    return out


def _adopt(
    path: str, shape: tuple[int, ...], key: dict, current: set[int], own: list[str]
) -> tuple[ScoreSum, list[str]]:
    """Rank 0: merge the files of ``path`` written with another number of ranks; ``(merge, files
    to delete)``. A file already inside ``current`` (merged by an earlier run that stopped before
    deleting it) is only deleted; one that overlaps the rest is refused."""
    parts: list[ScoreSum] = []
    taken: dict[int, str] = {}
    retire = []
    for file, _, n in dist.rank_files(path):
        if n == dist.world_size():
            continue
        acc = ScoreSum.load(file, key)
        if tuple(acc.sum.shape) != tuple(shape):
            raise ValueError(f"checkpoint {file} has shape {tuple(acc.sum.shape)}, expected {shape}")
        retire.append(file)
        if acc.done <= current:
            continue
        clash = sorted(acc.done & (current | set(taken)))
        if clash:
            other = sorted({taken[i] for i in clash if i in taken} | (set(own) if set(clash) & current else set()))
            raise ValueError(
                f"checkpoint {file} (written by a run on {n} process{'es' if n > 1 else ''}) and "
                f"{', '.join(other)} both hold examples {clash[:5]}: merging them would count those "
                "examples twice. Keep one set (delete the other files), or delete all of them to start over"
            )
        taken.update(dict.fromkeys(acc.done, file))
        parts.append(acc)
    return merge_shards(shape, key, parts), retire


def resume(path: str | None, shape: tuple[int, ...], key: dict) -> tuple[ScoreSum, set[int]]:
    """This rank's running sums for the checkpoint ``path`` (before :func:`dist.rank_path`) and the
    examples done on any rank, to skip. Every rank must call it (it gathers twice under torchrun).

    Rank 0 (or the single process) also adopts the files that a run with another number of ranks
    left: their sums join its own, saved at once to its file, and the adopted files are deleted.
    A damaged, foreign or overlapping file is a ValueError on every rank, before any work."""
    key = json.loads(json.dumps(key))
    mine = dist.rank_path(path)
    acc, error = ScoreSum(shape, key), None
    try:
        acc = ScoreSum.resume(mine, shape, key)  # type: ignore[arg-type]
    except ValueError as err:
        error = str(err)
    parts = dist.gather((sorted(acc.done), error))
    for r, (_, problem) in enumerate(parts):
        if problem:
            raise ValueError(problem if r == dist.rank() else f"rank {r}: {problem}")
    current: set[int] = set()
    for done, _ in parts:
        if current & set(done):
            raise ValueError(
                f"the checkpoints {path}.rank*-of-{dist.world_size()} overlap: damaged; delete them to start over"
            )
        current |= set(done)
    adopted, retire, error = ScoreSum(shape, key), list[str](), None
    if path is not None and dist.is_main():
        own = [f for f, _, n in dist.rank_files(path) if n == dist.world_size()]
        try:
            adopted, retire = _adopt(path, shape, key, current, own)
        except ValueError as err:
            error = str(err)
    error, extra_done = dist.gather((error, sorted(adopted.done)))[0]
    if error:
        raise ValueError(error)
    if dist.is_main() and mine is not None:
        if adopted.done:
            acc = merge_shards(shape, key, [acc, adopted])
            acc.save(mine)  # the merge is safe in this run's file before the adopted ones go
        for file in retire:
            Path(file).unlink(missing_ok=True)
    return acc, current | set(extra_done)
