"""Fault jobs for tests/core/test_distributed_faults.py: run with ``torchrun`` or plain python.

torchrun --standalone --nproc-per-node 2 distributed_fault_job.py hang CKPT
    CNL with a checkpoint; rank 1 stops itself (SIGSTOP) before its second example, so rank 0
    waits in the collective that merges the ranks' sums until $CAPINTERP_DIST_TIMEOUT.
python distributed_fault_job.py resume1 CKPT_A CKPT_B OUT.pt
    one process: an uninterrupted fit (the reference); the fit of CKPT_A (left by ``hang``,
    per rank); a fit of CKPT_B stopped after two examples; saves them to OUT.pt.
torchrun --standalone --nproc-per-node 2 distributed_fault_job.py resume2 CKPT_B REF.pt OUT.pt
    two ranks finish CKPT_B (left by one process); rank 0 saves the result to OUT.pt.
"""

import os
import signal
import sys

import torch

from capinterp.arch.model import load_model
from capinterp.core import distributed as dist
from capinterp.data import arithmetic
from capinterp.localizers.cnl import CNL

N = 9


class Stop(Exception):
    pass


def fit(model, ds, ckpt, stop_at=None, stop=None):
    """CNL over ``ds`` (one example per chunk); the indices of the examples this rank scored.
    ``stop()`` runs before this rank's example number ``stop_at`` (counting from 0)."""
    loc = CNL(model, steps=4, progress=False, checkpoint=ckpt)
    index = {e.prompt: i for i, e in enumerate(ds)}
    scored: list[int] = []
    score = loc._score_chunk

    def counted(items):
        if stop_at is not None and len(scored) == stop_at:
            stop()
        scored.extend(index[e.example.prompt] for e in items)
        return score(items)

    loc._score_chunk = counted
    try:
        loc.fit(ds)
    except Stop:
        return None, scored
    return loc, scored


def summary(loc, scored):
    return {
        "sum": loc.sums_.sum,
        "done": sorted(loc.sums_.done),
        "mask": loc.neurons_.mask,
        "ig_check": loc.meta_.get("ig_check"),
        "scored": sorted(scored),
    }


def stop_here():
    raise Stop


def main(mode: str, *args: str) -> None:
    model = load_model("tiny", threads=1)
    ds = arithmetic(ops="+", n=N, seed=0)
    assert len({e.prompt for e in ds}) == N
    if mode == "hang":
        dist.init()
        freeze = lambda: os.kill(os.getpid(), signal.SIGSTOP)  # noqa: E731
        fit(model, ds, args[0], stop_at=1 if dist.rank() == 1 else None, stop=freeze)
    elif mode == "resume1":
        ref, _ = fit(model, ds, None)
        a, scored = fit(model, ds, args[0])
        _, early = fit(model, ds, args[1], stop_at=2, stop=stop_here)
        res = {"ref": summary(ref, []), "a": summary(a, scored), "b_early": early}
        res["files_a"] = sorted(os.listdir(os.path.dirname(args[0])))
        torch.save(res, args[2])
    elif mode == "resume2":
        dist.init()
        b, scored = fit(model, ds, args[0])
        every = sorted(i for part in dist.gather(scored) for i in part)
        if dist.is_main():
            res = summary(b, every)
            res["files"] = sorted(os.listdir(os.path.dirname(args[0])))
            torch.save(res, args[2])
    dist.finish()


if __name__ == "__main__":
    main(sys.argv[1], *sys.argv[2:])
