"""A real 2-process ``torchrun`` launch (gloo, CPU, tiny model) gives the one-process results:
CNL and DCSN float64 sums to 1e-12 with identical located sets, causal-trace grids exactly,
per-rank checkpoints that resume with no work, evaluate's records, Query Localization's
per-query maps, a knowledge circuit's edge scores, faithfulness's random bands and curves (neurons
and edges, bit for bit), the IG completeness reports (CNL's, also
from the checkpoints alone, and Query Localization's) field for field, and the CLI writing the
same scores."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import capinterp
from capinterp.core import distributed as dist
from capinterp.units.neurons import NeuronScores

HERE = Path(__file__).parent
ROOT = Path(capinterp.__file__).parent.parent


def _env() -> dict:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    }
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(HERE), str(HERE.parent), env.get("PYTHONPATH", "")])
    env["CAPINTERP_THREADS"] = "1"
    return env


def _run(args: list[str], cwd: Path) -> None:
    done = subprocess.run(args, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def _torchrun(n: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={n}"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dp")
    job = str(HERE / "distributed_job.py")
    _run(_torchrun(2) + [job, str(tmp / "two.pt"), str(tmp / "ck2")], tmp)
    _run([sys.executable, job, str(tmp / "one.pt"), str(tmp / "ck1")], tmp)
    load = lambda name: torch.load(tmp / name, weights_only=False)  # noqa: E731
    return load("one.pt"), load("two.pt"), tmp


def test_two_ranks_equal_one_process(runs):
    one, two, tmp = runs
    assert (one["world"], two["world"]) == (1, 2)
    for name in ("cnl", "dcsn"):
        a, b = one[name], two[name]
        assert a["sum"].dtype == torch.float64 and a["done"] == b["done"] == list(range(7))
        rel = float((a["sum"] - b["sum"]).abs().max() / a["sum"].abs().max())
        assert rel < 1e-12, (name, rel)
        assert torch.equal(a["mask"], b["mask"]) and a["mask"].any(), name
        assert a["ig_check"] == b["ig_check"], name  # exactly: every rank's records, in index order
    assert one["cnl"]["ig_check"]["n_examples"] == 7 and one["dcsn"]["ig_check"] is None
    ta, tb = one["trace"], two["trace"]
    assert ta["index"] == tb["index"] == [0, 1, 2] and ta["layers"] == tb["layers"]
    assert torch.equal(ta["grid"].nan_to_num(), tb["grid"].nan_to_num())
    for ga, gb in zip(ta["per_prompt"], tb["per_prompt"]):
        assert torch.equal(ga, gb)
    assert one["evaluate"] == two["evaluate"] and len(one["evaluate"]["records"]) == 7
    qa, qb = one["ql"], two["ql"]
    assert len(qa["scores"]) == 3 and all(torch.equal(a, b) for a, b in zip(qa["scores"], qb["scores"]))
    assert qa["consistency"] == qb["consistency"]
    assert qa["ig_check"] == qb["ig_check"] and qa["ig_check"]["n_examples"] == 9  # every fact's queries
    ka, kb = one["kc"], two["kc"]
    rel = float((ka["scores"] - kb["scores"]).abs().max() / ka["scores"].abs().max())
    assert rel < 1e-6, rel  # float64 sums over ranks, returned as float32
    assert torch.equal(ka["mask"], kb["mask"]) and ka["clean_loss"] == kb["clean_loss"]
    # faithfulness: every (configuration, example) measured by one rank in one process's batch: equal bits
    for name in ("faith", "faith_edges"):
        fa, fb = one[name], two[name]
        assert fa["band"].shape == (2 + 2 * 2 * 3, 3 if name == "faith_edges" else 7), name
        assert np.array_equal(fa["band"], fb["band"]) and fa["table"] == fb["table"], name
    # each rank checkpointed its own shard of a fit; together they cover the dataset once; the random
    # bands are one file each, written by rank 0
    assert sorted(p.name for p in (tmp / "ck2").iterdir()) == [
        "cnl.ckpt.rank0-of-2",
        "cnl.ckpt.rank1-of-2",
        "dcsn.ckpt.rank0-of-2",
        "dcsn.ckpt.rank1-of-2",
        "faith_band.npz",
        "faith_edges_band.npz",
    ]


@pytest.mark.slow  # two more launches (~45 s on a loaded 2-core CPU)
def test_cli_under_torchrun_writes_the_single_process_scores(tmp_path):
    args = ["localize", "--method", "cnl", "--model", "tiny", "--ops", "+", "--n-examples", "6", "--threads", "1"]
    args += ["--examples", "all"]  # the random tiny model answers none correctly
    args += ["--steps", "4"]  # the ranks' sums must equal one process's whatever the IG steps: few of them
    _run(_torchrun(2) + ["-m", "capinterp", *args, "--out", str(tmp_path / "two")], tmp_path)
    _run([sys.executable, "-m", "capinterp", *args, "--out", str(tmp_path / "one")], tmp_path)
    a = NeuronScores.load(tmp_path / "one" / "cnl_scores.capi")[:]
    b = NeuronScores.load(tmp_path / "two" / "cnl_scores.capi")[:]
    assert float((a - b).abs().max() / a.abs().max()) < 1e-6  # saved as float32 means
    assert len(list((tmp_path / "two").glob("cnl-*.ckpt.rank1-of-2"))) == 1  # named by the computation's key


@pytest.mark.slow  # two more launches (~35 s on a loaded 2-core CPU)
def test_reproduce_under_torchrun_writes_the_single_process_tables(tmp_path):
    args = ["reproduce", "--quick", "--only", "commonality,erase", "--model", "tiny", "--threads", "1"]
    _run(_torchrun(2) + ["-m", "capinterp", *args, "--out", str(tmp_path / "two")], tmp_path)
    _run([sys.executable, "-m", "capinterp", *args, "--out", str(tmp_path / "one")], tmp_path)
    for name in ("commonality", "erase"):
        a = (tmp_path / "one" / "experiments" / name / "table.csv").read_text()
        assert a == (tmp_path / "two" / "experiments" / name / "table.csv").read_text(), name
    ckpts = sorted(p.name for p in (tmp_path / "two" / "cache" / "checkpoints").iterdir())
    assert any(n.endswith("rank1-of-2") for n in ckpts)  # the fits were sharded
    assert not list((tmp_path / "two").glob("*.tmp"))


def test_one_process_helpers_are_no_ops():
    assert not dist.active() and dist.rank() == 0 and dist.world_size() == 1 and dist.is_main()
    assert dist.shard([1, 2, 3]) == [1, 2, 3] and dist.gather("x") == ["x"]
    t = torch.ones(2, dtype=torch.float64)
    assert dist.all_reduce_sum(t) is t and dist.rank_path("a.ckpt") == "a.ckpt"
