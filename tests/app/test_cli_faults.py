"""The command line's outputs under faults: written atomically (never half a file, never through a
symbolic link), a full disk or a refused name a one-line error (exit 2), names checked before any
work, and a killed run's leftovers (owner file, run.json, timing) handled on the rerun."""

from __future__ import annotations

import builtins
import errno
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go
import pytest

from capinterp.app.cli import main
from capinterp.app.outdir import OWNER_NAME
from capinterp.experiments import EXPERIMENTS, Context, ExperimentResult, experiment
from capinterp.localizers.dcsn import DCSN
from capinterp.plots.html import write_html
from capinterp.units.neurons import NeuronScores

LOCALIZE = ["localize", "--model", "tiny", "--method", "dcsn", "--n", "4", "--examples", "all"]
REPRODUCE = ["reproduce", "--quick", "--only", "toy_faults", "--model", "tiny"]


@pytest.fixture
def toy_experiment():
    """One throwaway experiment (a table and a figure), removed from the registry afterwards."""
    before = dict(EXPERIMENTS)

    @experiment("toy_faults", "Toy experiment for faults")
    def toy(ctx: Context) -> ExperimentResult:
        table = pd.DataFrame({"i": range(3), "v": [0.5, 0.25, 0.125]})
        return ExperimentResult("toy_faults", "Toy experiment for faults", table, go.Figure(go.Bar(y=table["v"])))

    yield
    EXPERIMENTS.clear()
    EXPERIMENTS.update(before)


class _Filling:
    """A file on a disk with ``disk["free"]`` bytes left: a longer write writes what fits, then
    raises ENOSPC (as a real full disk does: the file is left truncated)."""

    def __init__(self, f, disk: dict) -> None:
        self._f, self._disk = f, disk

    def write(self, data):
        if len(data) > self._disk["free"]:
            self._f.write(data[: self._disk["free"]])
            self._f.flush()
            self._disk["free"] = 0
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self._disk["free"] -= len(data)
        return self._f.write(data)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._f.close()

    def __iter__(self):
        return iter(self._f)

    def __getattr__(self, name):
        return getattr(self._f, name)


@pytest.fixture
def full_disk(monkeypatch):
    """``full_disk(folder, free, spare=1)``: files opened for writing under ``folder`` share ``free``
    bytes, after the first ``spare`` files (the run's owner file) are written in full. Python-level
    writes only (``open``, ``Path.write_text``); returns the disk's state (``opened``: their names)."""
    real = io.open

    def install(folder: Path, free: int, spare: int = 1) -> dict:
        disk = {"free": free, "spare": spare, "opened": []}
        root = str(Path(folder).absolute())

        def fake_open(file, mode="r", *args, **kwargs):
            f = real(file, mode, *args, **kwargs)
            if isinstance(file, int) or not any(c in mode for c in "wxa+"):
                return f
            if not str(Path(os.fsdecode(file)).absolute()).startswith(root + os.sep):
                return f
            disk["opened"].append(Path(os.fsdecode(file)).name)
            if disk["spare"] > 0:
                disk["spare"] -= 1
                return f
            return _Filling(f, disk)

        monkeypatch.setattr(io, "open", fake_open)
        monkeypatch.setattr(builtins, "open", fake_open)
        return disk

    return install


def _one_error_line(err: str) -> str:
    """The command's error: one line of stderr from 'capinterp: error:' on, no traceback."""
    assert "Traceback" not in err
    assert err.count("capinterp: error:") == 1, err
    line = "capinterp: error:" + err.split("capinterp: error:")[1].split("\n")[0]  # after any progress bar
    assert "\r" not in line
    return line


def _no_temp_files(folder: Path) -> None:
    left = [p.name for p in folder.rglob("*.tmp")]
    assert left == [], f"temporary files left behind: {left}"


# ---------------------------------------------------------------------------- symlinks
def test_symlinked_outputs_are_replaced_not_followed(tmp_path, capsys, toy_experiment):
    """Issue 51 item 5: a link named like an output had its target overwritten with the page."""
    victim = tmp_path / "precious.txt"
    victim.write_text("the user's own file")
    out = tmp_path / "loc"
    out.mkdir()
    (out / "dcsn_heatmap.html").symlink_to(victim)
    assert main([*LOCALIZE, "--out", str(out)]) == 0
    assert victim.read_text() == "the user's own file"
    page = out / "dcsn_heatmap.html"
    assert not page.is_symlink() and "plotly" in page.read_text()

    rep = tmp_path / "rep"
    rep.mkdir()
    for name in ("report.html", "results.json", "run.json"):
        (rep / name).symlink_to(victim)
    # run.json as a link to a non-JSON file reads as damaged: with no result yet it is rewritten
    assert main([*REPRODUCE, "--out", str(rep)]) == 0
    assert victim.read_text() == "the user's own file"
    assert not any((rep / n).is_symlink() for n in ("report.html", "results.json", "run.json"))
    assert "Toy experiment for faults" in (rep / "report.html").read_text()
    capsys.readouterr()


# ---------------------------------------------------------------------------- full disk
def test_full_disk_while_writing_the_heatmap_is_one_line_and_leaves_no_partial_page(tmp_path, capsys, full_disk):
    """Issue 51 item 7: a raw OSError traceback and a truncated heatmap."""
    out = tmp_path / "o"
    disk = full_disk(out, free=100_000)  # the .capi files pass (written natively); the 4.8 MB page does not
    assert main([*LOCALIZE, "--out", str(out)]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert str(out / "dcsn_heatmap.html") in line and "No space left on device" in line and "ENOSPC" in line
    assert disk["opened"], "the fake disk saw no write"
    assert not (out / "dcsn_heatmap.html").exists()
    _no_temp_files(out)
    disk["free"] = 10**9  # space freed: the rerun completes, resuming from the checkpoint
    assert main([*LOCALIZE, "--out", str(out)]) == 0
    assert "resumed from checkpoint" in capsys.readouterr().err
    assert (out / "dcsn_heatmap.html").stat().st_size > 1_000_000


def test_full_disk_while_saving_a_checkpoint_is_one_line(tmp_path, capsys, full_disk):
    """A checkpoint written natively (safetensors) raised SafetensorError, a raw traceback."""
    out = tmp_path / "o"
    disk = full_disk(out, free=0)  # the owner file is written, then the disk is full
    assert main([*LOCALIZE, "--out", str(out)]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert ".ckpt" in line and str(out) in line and "ENOSPC" in line
    assert [p.name for p in out.iterdir() if not p.name.startswith(".capinterp")] == []
    disk["free"] = 10**9
    assert main([*LOCALIZE, "--out", str(out)]) == 0


def test_full_disk_on_run_json_leaves_nothing_that_blocks_the_rerun(tmp_path, capsys, full_disk, toy_experiment):
    """Issue 51 item 7: with 4 KB free the run left an empty run.json, and the rerun was refused."""
    out = tmp_path / "rep"
    disk = full_disk(out, free=0)  # the owner file is written, then the disk is full
    assert main([*REPRODUCE, "--out", str(out)]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert str(out / "run.json") in line and "No space left on device" in line
    assert not (out / "run.json").exists()
    _no_temp_files(out)
    disk["free"] = 10**9
    assert main([*REPRODUCE, "--out", str(out)]) == 0
    assert json.loads((out / "run.json").read_text())["quick"] is True


def test_full_disk_on_the_report_stops_with_one_line_and_the_rerun_loads_the_result(
    tmp_path, capsys, full_disk, toy_experiment
):
    out = tmp_path / "rep"
    disk = full_disk(out, free=200_000)  # run.json, results.json, the experiment's files fit; the report not
    assert main([*REPRODUCE, "--out", str(out)]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert str(out / "report.html") in line and "ENOSPC" in line
    assert not (out / "report.html").exists()
    _no_temp_files(out)
    disk["free"] = 10**9
    assert main([*REPRODUCE, "--out", str(out)]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["experiments"]["toy_faults"]["status"] == "loaded"
    assert isinstance(res["experiments"]["toy_faults"]["seconds"], float)


@pytest.mark.parametrize("leftover", ["", '{"model": ', "[]"])
def test_an_empty_or_damaged_run_json_does_not_block_a_rerun(tmp_path, capsys, toy_experiment, leftover):
    """What an older version left after a full disk: rewritten when nothing contradicts it."""
    out = tmp_path / "rep"
    out.mkdir()
    (out / "run.json").write_text(leftover)
    assert main([*REPRODUCE, "--out", str(out)]) == 0
    assert "run.json was" in capsys.readouterr().err  # said, not silent
    assert json.loads((out / "run.json").read_text())["quick"] is True


def test_a_damaged_run_json_beside_results_of_unknown_settings_says_how_to_proceed(tmp_path, capsys, toy_experiment):
    out = tmp_path / "rep"
    assert main([*REPRODUCE, "--out", str(out)]) == 0
    (out / "run.json").write_text("")
    (out / "results.json").unlink()  # nothing tells the settings of the saved experiment
    assert main([*REPRODUCE, "--out", str(out)]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert "--fresh" in line
    assert main([*REPRODUCE, "--out", str(out), "--fresh"]) == 0


# ---------------------------------------------------------------------------- names
def test_dangling_symlink_out_is_a_one_line_error(tmp_path, capsys, no_load):
    """Issue 51 item 8: a raw FileExistsError, exit 1."""
    link = tmp_path / "out"
    link.symlink_to(tmp_path / "gone")
    for command in (LOCALIZE, REPRODUCE, ["main", "--model", "tiny"]):
        assert main([*command, "--out", str(link)]) == 2
        line = _one_error_line(capsys.readouterr().err)
        assert "symbolic link" in line and "gone" in line


@pytest.mark.parametrize("where", ["last", "middle"])
def test_an_overlong_name_in_out_is_a_one_line_error(tmp_path, capsys, no_load, where):
    """Issue 51 item 8: a raw ENAMETOOLONG, exit 1."""
    long = "n" * 300
    out = tmp_path / long if where == "last" else tmp_path / long / "sub"
    for command in (LOCALIZE, ["main", "--model", "tiny"]):
        assert main([*command, "--out", str(out)]) == 2
        line = _one_error_line(capsys.readouterr().err)
        assert "300 bytes" in line and "255" in line and len(line) < 400
    assert long not in os.listdir(tmp_path)


def test_a_255_byte_legal_name_works(tmp_path, tiny):
    """Issue 51 item 8: names of 252-255 bytes failed because the temporary name was longer."""
    name = "x" * 250
    page = write_html(go.Figure(go.Bar(y=[1, 2])), tmp_path / f"{name}.html")
    assert len(page.name) == 255 and "plotly" in page.read_text()
    scores = NeuronScores(__import__("torch").rand(tiny.cfg.n_layers, tiny.cfg.d_mlp))
    scores.save(tmp_path / f"{name}.capi")
    assert (NeuronScores.load(tmp_path / f"{name}.capi").scores == scores.scores).all()
    ckpt = tmp_path / f"{name}.ckpt"
    examples = [("1+1=", "2"), ("2+2=", "4")]
    DCSN(tiny, checkpoint=ckpt, progress=False).fit(examples)
    assert ckpt.is_file() and len(ckpt.name) == 255
    _no_temp_files(tmp_path)


@pytest.mark.parametrize("stem", ["c" * 300 + ".ckpt", "c" * 245 + "-{key}.ckpt"])
def test_an_overlong_checkpoint_name_is_refused_before_any_forward(tmp_path, tiny, stem):
    """Issue 51 item 8: a 245+ byte checkpoint name (with its key) failed after the first example."""
    forwards = []
    handle = tiny.embed.register_forward_hook(lambda *a: forwards.append(1))
    try:
        with pytest.raises(ValueError, match="bytes per name"):
            DCSN(tiny, checkpoint=tmp_path / stem, progress=False).fit([("1+1=", "2"), ("2+2=", "4")])
    finally:
        handle.remove()
    assert forwards == []


# ---------------------------------------------------------------------------- killed runs
def _dead_pid() -> int:
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(proc.stdout)


def test_a_killed_runs_owner_file_is_replaced_with_a_note(tmp_path, capsys, toy_experiment):
    """Issue 51 item 10: a stale .capinterp.owner stayed without a word."""
    out = tmp_path / "rep"
    out.mkdir()
    pid = _dead_pid()
    (out / OWNER_NAME).write_text(str(pid))  # what a SIGKILLed run leaves
    assert main([*REPRODUCE, "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert f"named process {pid}" in err and "killed" in err
    assert not (out / OWNER_NAME).exists()


def test_seconds_of_an_experiment_finished_before_a_kill_are_kept(tmp_path, capsys, toy_experiment):
    """Issue 51 item 10: "seconds": null for a finished experiment after a kill (its folder was
    complete, results.json not yet rewritten)."""
    out = tmp_path / "rep"
    assert main([*REPRODUCE, "--out", str(out)]) == 0
    first = json.loads(capsys.readouterr().out)["experiments"]["toy_faults"]["seconds"]
    (out / "results.json").unlink()  # killed between the experiment's folder and results.json
    assert main([*REPRODUCE, "--out", str(out)]) == 0
    again = json.loads(capsys.readouterr().out)["experiments"]["toy_faults"]
    assert again["status"] == "loaded" and again["seconds"] == first and first is not None


def test_a_failed_torchrun_peer_is_one_line_not_a_traceback(tmp_path, capsys, monkeypatch):
    """Issue 51 item 9: a RankFailure (a peer rank hung or died) reached the user as a traceback."""
    from capinterp.app import cli
    from capinterp.core.distributed import RankFailure

    def hung(args):
        raise RankFailure("rank 0 of 2: collective #3 (all_gather_object) failed: rank 1 did not answer within 3 s")

    monkeypatch.setitem(cli.COMMANDS, "localize", hung)
    assert main([*LOCALIZE, "--out", str(tmp_path / "out")]) == 1
    line = _one_error_line(capsys.readouterr().err)
    assert "rank 1 did not answer" in line
