"""Faults under ``torchrun`` (real 2-process gloo launches, tiny model, 1 thread per process):
a rank that hangs (SIGSTOP) makes the others fail within ``$CAPINTERP_DIST_TIMEOUT`` with a
message naming it, instead of waiting forever; the per-rank checkpoints it leaves resume on one
process to the one-process result, scoring only what is missing, and one process's checkpoint
resumes on two ranks. Checkpoints that cannot be merged (they overlap) are refused, naming them."""

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import capinterp
from capinterp.arch.model import load_model
from capinterp.core import distributed as dist
from capinterp.data import arithmetic
from capinterp.localizers.cnl import CNL

HERE = Path(__file__).parent
ROOT = Path(capinterp.__file__).parent.parent
JOB = str(HERE / "distributed_fault_job.py")
TIMEOUT = 3  # seconds a collective waits in these launches


def _env() -> dict:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    }
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(HERE), env.get("PYTHONPATH", "")])
    env["CAPINTERP_THREADS"] = "1"
    env["CAPINTERP_DIST_TIMEOUT"] = str(TIMEOUT)
    return env


# torchrun, its grace between SIGTERM and SIGKILL for the ranks it stops cut from 30 s to 3 s: the
# stopped rank ignores SIGTERM, so the hang test used to sit idle for those 30 s
TORCHRUN = (
    "import signal; from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent as A; "
    "A._shutdown.__defaults__ = (signal.SIGTERM, 3); from torch.distributed.run import main; main()"
)


def _launch(args: list[str], cwd: Path, n: int = 1) -> subprocess.CompletedProcess:
    pre = [sys.executable] if n == 1 else [sys.executable, "-c", TORCHRUN, "--standalone"]
    pre += [] if n == 1 else [f"--nproc-per-node={n}"]
    # the guard: today's code waited forever (gloo's default: 30 minutes) for the stopped rank
    return subprocess.run(pre + [JOB, *args], cwd=cwd, env=_env(), capture_output=True, text=True, timeout=400)


@pytest.fixture(scope="module")
def hung(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("faults")
    (tmp / "a").mkdir()
    (tmp / "b").mkdir()
    start = time.monotonic()
    done = _launch(["hang", str(tmp / "a" / "cnl.ckpt")], tmp, n=2)
    return done, time.monotonic() - start, tmp


def test_a_stopped_rank_fails_the_others_with_a_clear_message(hung):
    done, seconds, tmp = hung
    out = done.stdout + done.stderr
    assert done.returncode != 0, out[-3000:]
    assert "RankFailure" in out and f"rank 1 did not answer within {TIMEOUT} s" in out, out[-3000:]
    assert "all_gather_object" in out and "CAPINTERP_DIST_TIMEOUT" in out and "resumes from the checkpoints" in out
    # startup and the work, the timeout, then torchrun's grace (3 s here) before it SIGKILLs the stopped rank
    assert seconds < 300, seconds
    assert sorted(p.name for p in (tmp / "a").iterdir()) == ["cnl.ckpt.rank0-of-2", "cnl.ckpt.rank1-of-2"]


@pytest.fixture(scope="module")
def resumed(hung):
    _, _, tmp = hung
    args = ["resume1", str(tmp / "a" / "cnl.ckpt"), str(tmp / "b" / "cnl.ckpt"), str(tmp / "one.pt")]
    done = _launch(args, tmp)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return torch.load(tmp / "one.pt", weights_only=False), tmp


def _same(a: dict, ref: dict) -> None:
    assert a["done"] == ref["done"] == list(range(9))
    assert float((a["sum"] - ref["sum"]).abs().max() / ref["sum"].abs().max()) < 1e-12
    assert torch.equal(a["mask"], ref["mask"]) and a["ig_check"] == ref["ig_check"]
    assert a["ig_check"]["n_examples"] == 9


@pytest.mark.slow  # one more launch (~50 s on a loaded 2-core CPU)
def test_two_ranks_checkpoints_resume_on_one_process(resumed):
    res, _ = resumed
    # rank 0 scored 0, 2, 4, 6, 8 and rank 1 only 1 before it stopped: the rest, nothing again
    assert res["a"]["scored"] == [3, 5, 7]
    _same(res["a"], res["ref"])
    assert res["files_a"] == ["cnl.ckpt"]  # the merge is in the one-process file; the rank files are gone


@pytest.mark.slow  # one more 2-process launch (~60 s on a loaded 2-core CPU)
def test_one_process_checkpoint_resumes_on_two_ranks(resumed):
    res, tmp = resumed
    assert res["b_early"] == [0, 1]  # one process stopped after two examples
    done = _launch(["resume2", str(tmp / "b" / "cnl.ckpt"), str(tmp / "one.pt"), str(tmp / "two.pt")], tmp, n=2)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    two = torch.load(tmp / "two.pt", weights_only=False)
    assert two["scored"] == list(range(2, 9))
    _same(two, res["ref"])
    assert two["files"] == ["cnl.ckpt.rank0-of-2", "cnl.ckpt.rank1-of-2"]


# -- one process, files arranged by hand ------------------------------------------------
@pytest.fixture(scope="module")
def model():
    return load_model("tiny", threads=1)


def _partial(model, ds, ckpt: Path, n: int) -> None:
    """A one-process CNL fit of ``ds`` stopped after ``n`` examples, checkpointed at ``ckpt``."""
    loc = CNL(model, steps=2, progress=False, checkpoint=ckpt)
    score, seen = loc._score_chunk, []

    def stop(items):
        if len(seen) == n:
            raise KeyboardInterrupt
        seen.extend(items)
        return score(items)

    loc._score_chunk = stop
    with pytest.raises(KeyboardInterrupt):
        loc.fit(ds)


def test_overlapping_checkpoints_are_refused_naming_them(model, tmp_path):
    ds = arithmetic(ops="+", n=4, seed=1)
    ckpt = tmp_path / "cnl.ckpt"
    _partial(model, ds, ckpt, 2)
    shutil.copy(ckpt, f"{ckpt}.rank0-of-2")  # the same examples, as if two runs did them twice
    shutil.move(ckpt, f"{ckpt}.rank1-of-2")
    loc = CNL(model, steps=2, progress=False, checkpoint=ckpt)
    loc._score_chunk = None  # no work before the refusal
    with pytest.raises(ValueError, match=r"rank1-of-2 \(written by a run on 2 processes\) and .*rank0-of-2 both"):
        loc.fit(ds)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cnl.ckpt.rank0-of-2", "cnl.ckpt.rank1-of-2"]


def test_a_file_already_merged_is_dropped_not_counted_twice(model, tmp_path):
    ds = arithmetic(ops="+", n=4, seed=1)
    ckpt = tmp_path / "cnl.ckpt"
    _partial(model, ds, ckpt, 2)
    shutil.copy(ckpt, f"{ckpt}.rank1-of-3")  # a merge that stopped before deleting what it adopted
    loc = CNL(model, steps=2, progress=False, checkpoint=ckpt)
    score, seen = loc._score_chunk, []
    loc._score_chunk = lambda items: (seen.extend(items), score(items))[1]
    loc.fit(ds)
    assert len(seen) == 2 and loc.sums_.count == 4
    ref = CNL(model, steps=2, progress=False).fit(ds)
    assert float((loc.sums_.sum - ref.sums_.sum).abs().max() / ref.sums_.sum.abs().max()) < 1e-12
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cnl.ckpt"]


def test_timeout_setting(monkeypatch):
    monkeypatch.delenv(dist.TIMEOUT_ENV, raising=False)
    assert dist.timeout_seconds() == dist.DEFAULT_TIMEOUT == 1800  # a slow chunk on a CPU is not a hang
    assert dist.timeout_seconds(2.5) == 2.5
    for bad in (0, -1, float("nan"), float("inf"), True, "5"):
        with pytest.raises(ValueError, match="a number > 0"):
            dist.timeout_seconds(bad)  # type: ignore[arg-type]
    monkeypatch.setenv(dist.TIMEOUT_ENV, "7")
    assert dist.timeout_seconds() == 7.0 and dist.timeout_seconds(2) == 2.0  # the argument wins
    monkeypatch.setenv(dist.TIMEOUT_ENV, "soon")
    with pytest.raises(ValueError, match=r"\$CAPINTERP_DIST_TIMEOUT='soon'"):
        dist.init()  # refused on one process too, before any work
