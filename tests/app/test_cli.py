"""The command line: JSON on stdout, every bad argument a one-line error before the model loads,
output folders checked and locked, checkpoints named by the computation, data options, plotly.js."""

import inspect
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from capinterp.app import main_job
from capinterp.app.args import data_kwargs
from capinterp.app.cli import build_parser, main
from capinterp.data import arithmetic
from capinterp.kernels.evaluate import EvalResult
from capinterp.units.neurons import NeuronScores

ROOT = Path(__file__).resolve().parents[2]


def _json(capsys) -> dict:
    """stdout of the last command, which must be exactly one JSON document."""
    return json.loads(capsys.readouterr().out)


def test_info_prints_json(capsys):
    assert main(["info", "--model", "tiny", "--threads", "1"]) == 0
    cap = capsys.readouterr()
    info = json.loads(cap.out)
    assert info["n_layers"] == 4 and info["d_mlp"] == 128 and info["n_neurons"] == 512
    assert info["neuron_hooks"][-1] == "blocks.3.mlp.hook_post"
    assert "layers       4" in cap.err  # the human-readable table goes to stderr


def test_evaluate_prints_json(capsys):
    assert main(["evaluate", "--model", "tiny", "--ops", "+", "--fmt", "DG", "--n", "6"]) == 0
    res = _json(capsys)
    assert res["n"] == 6 and 0 <= res["accuracy"] <= 1 and res["style"] == "compact"


def test_localize_writes_outputs(tmp_path, capsys):
    out = tmp_path / "o"
    argv = ["localize", "--model", "tiny", "--method", "dcsn", "--n", "6", "--examples", "all", "--out", str(out)]
    assert main(argv) == 0
    res = _json(capsys)
    assert res["method"] == "dcsn" and res["examples"] == {"mode": "all", "total": 6, "used": 6, "dropped": 0}
    assert (out / "dcsn_heatmap.html").exists() and (out / "dcsn_neurons.capi").exists()
    assert (out / "dcsn_heatmap.html").stat().st_size > 1_000_000  # plotly.js embedded by default
    assert re.fullmatch(r"dcsn-[0-9a-f]{16}\.ckpt", Path(res["checkpoint"]).name)


def test_main_and_reproduce_list_print_json(tmp_path, capsys):
    out = tmp_path / "m"
    argv = ["main", "--model", "tiny", "--n", "3", "--examples", "all", "--batch-size", "4", "--out", str(out)]
    assert main(argv) == 0
    res = _json(capsys)
    assert res["examples"]["used"] == 3 and res["cnl_neurons"] >= 0
    assert json.loads((out / "summary.json").read_text()) == res
    assert main(["reproduce", "--list"]) == 0
    assert "cnlf" in _json(capsys)


def test_bad_input_is_a_clear_error(capsys):
    assert main(["evaluate", "--model", "tiny", "--n", "0"]) == 2
    assert "n must be" in capsys.readouterr().err
    assert main(["info", "--model", "no-such-model"]) == 2
    assert "unknown model" in capsys.readouterr().err
    assert main(["localize", "--model", "tiny", "--method", "nope", "--n", "2"]) == 2
    assert main(["localize", "--model", "tiny", "--method", "knowledge_circuit", "--n", "2"]) == 2
    assert "subject" in capsys.readouterr().err  # circuits and tracing need facts with a subject (--data)
    assert main(["reproduce", "--model", "tiny", "--only", "fidelity", "--data", "/no/such/dir"]) == 2
    assert "--data '/no/such/dir' is not a folder" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["evaluate", "--fmt", "XX"])


@pytest.mark.parametrize(
    "argv, message",
    [
        (["evaluate", "--lang", "zh"], "style"),  # compact style is English only (issue 31, item 9)
        (["evaluate", "--n-ops", "9"], "n_ops"),
        (["evaluate", "--digits", "0"], "digits"),
        (["main", "--shots", "-1"], "shots"),
        (["localize", "--device", "cuda:7"], "cuda:7"),
        (["localize", "--threads", "0"], "threads"),
    ],
)
def test_bad_arguments_fail_before_the_model_loads(argv, message, no_load, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("capinterp: error:") and message in err and err.count("\n") == 1


@pytest.mark.parametrize("command", ["evaluate", "main"])
def test_batch_size_auto_is_refused_by_the_parser_where_unsupported(command, no_load, capsys):
    with pytest.raises(SystemExit) as ex:  # argparse's usage error, exit 2, before anything loads
        main([command, "--batch-size", "auto"])
    assert ex.value.code == 2 and "'capinterp localize' only" in capsys.readouterr().err
    args = build_parser().parse_args(["localize", "--batch-size", "auto"])
    assert args.batch_size == "auto"


def test_data_options_cover_the_generator(tmp_path, capsys):
    args = build_parser().parse_args(["evaluate"])
    assert set(data_kwargs(args)) == set(inspect.signature(arithmetic).parameters)
    argv = ["evaluate", "--model", "tiny", "--lang", "zh", "--style", "fewshot", "--n", "4", "--digits", "1-2"]
    assert main([*argv, "--n-ops", "2", "--shots", "2", "--unique"]) == 0
    res = _json(capsys)
    assert res["lang"] == "zh" and res["style"] == "fewshot" and res["n"] == 4
    args = build_parser().parse_args(["main", "--digits", "1-2", "--tf-labels", "Ja,Nein", "--allow-negative"])
    assert args.digits == (1, 2) and args.tf_labels == ("Ja", "Nein") and args.allow_negative


@pytest.mark.parametrize("command", ["localize", "main", "reproduce"])
def test_out_under_a_file_fails_before_the_model_loads(command, tmp_path, no_load, capsys):
    (tmp_path / "file.py").write_text("x = 1\n")
    assert main([command, "--model", "tiny", "--out", str(tmp_path / "file.py" / "sub")]) == 2
    err = capsys.readouterr().err
    assert "file.py" in err and "existing file, as a parent" in err and err.count("\n") == 1
    assert main([command, "--model", "tiny", "--out", str(tmp_path / "file.py")]) == 2
    assert "is an existing file" in capsys.readouterr().err


def test_unwritable_out_fails_before_the_model_loads(tmp_path, no_load, capsys, monkeypatch):
    from capinterp.app import outdir

    locked = tmp_path / "ro"
    locked.mkdir()
    real = os.access
    monkeypatch.setattr(outdir.os, "access", lambda p, mode: Path(p) != locked and real(p, mode))
    assert main(["main", "--model", "tiny", "--out", str(locked / "a" / "b")]) == 2
    assert f"folder '{locked}' is not writable" in capsys.readouterr().err


_HOLDER = """
import sys, time
from pathlib import Path
from capinterp.app.outdir import hold
with hold(sys.argv[1]) as d:
    (d / "result.txt").write_text("first run's result")
    print("held", flush=True)
    time.sleep(float(sys.argv[2]))
"""


def test_second_run_on_a_folder_in_use_stops_and_leaves_the_first_intact(tmp_path, no_load, capsys):
    out = tmp_path / "shared"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    first = subprocess.Popen([sys.executable, "-c", _HOLDER, str(out), "5"], stdout=subprocess.PIPE, env=env, text=True)
    try:
        assert first.stdout.readline().strip() == "held"  # the other process holds the folder now
        for command in ("localize", "main", "reproduce"):
            assert main([command, "--model", "tiny", "--n", "2", "--out", str(out)] if command != "reproduce"
                        else [command, "--model", "tiny", "--out", str(out)]) == 2  # fmt: skip
            err = capsys.readouterr().err
            assert f"in use by process {first.pid}" in err and err.count("\n") == 1
        assert (out / "result.txt").read_text() == "first run's result"
    finally:
        assert first.wait(timeout=60) == 0
    # released when the first process ends: the folder can be taken again
    from capinterp.app.outdir import hold

    with hold(out):
        assert (out / "result.txt").read_text() == "first run's result"


def test_checkpoints_are_named_by_the_computation(tmp_path, capsys, monkeypatch):
    from capinterp.localizers.dcsn import DCSN

    out = tmp_path / "o"
    base = ["localize", "--model", "tiny", "--method", "dcsn", "--n", "4", "--examples", "all", "--out", str(out)]
    assert main(base) == 0
    first = _json(capsys)["checkpoint"]
    assert main([*base, "--seed", "1"]) == 0  # other data: starts fresh beside the old checkpoint
    second = _json(capsys)["checkpoint"]
    assert first != second and Path(first).exists() and Path(second).exists()
    calls = []
    real = DCSN._score_chunk
    monkeypatch.setattr(DCSN, "_score_chunk", lambda self, items: calls.append(len(items)) or real(self, items))
    scores = NeuronScores.load(out / "dcsn_scores.capi").scores.clone()
    assert main([*base, "--seed", "1"]) == 0  # the same computation resumes: nothing is scored again
    assert _json(capsys)["checkpoint"] == second and calls == []
    assert main([*base, "--seed", "2"]) == 0 and calls  # a third computation is scored
    assert main([*base, "--seed", "1"]) == 0
    assert (NeuronScores.load(out / "dcsn_scores.capi").scores == scores).all()


def _half_right(model, ds, batch_size=16, **kw):
    """An evaluation in which exactly the even-numbered examples are answered correctly."""
    return EvalResult(0.5, 0.5, len(ds), [{"correct": i % 2 == 0} for i in range(len(ds))])


def test_localize_uses_correct_examples_by_default(tmp_path, capsys, monkeypatch):
    out = tmp_path / "o"
    argv = ["localize", "--model", "tiny", "--method", "dcsn", "--n", "6", "--out", str(out)]
    assert main(argv) == 2  # the random tiny model answers nothing correctly
    assert "--examples all" in capsys.readouterr().err
    monkeypatch.setattr(main_job, "evaluate", _half_right)
    assert main(argv) == 0
    res = _json(capsys)
    assert res["examples"] == {"mode": "correct", "total": 6, "used": 3, "dropped": 3}
    assert NeuronScores.load(out / "dcsn_scores.capi").meta["n_samples"] == 3
    assert main([*argv, "--examples", "all"]) == 0
    assert _json(capsys)["examples"]["used"] == 6
    assert NeuronScores.load(out / "dcsn_scores.capi").meta["n_samples"] == 6


def test_plotlyjs_directory_writes_one_shared_bundle(tmp_path, capsys):
    out = tmp_path / "o"
    argv = ["localize", "--model", "tiny", "--method", "dcsn", "--n", "3", "--examples", "all"]
    assert main([*argv, "--out", str(out), "--plotlyjs", "directory"]) == 0
    page = (out / "dcsn_heatmap.html").read_text()
    assert 'src="plotly.min.js"' in page and len(page) < 200_000
    bundle = out / "plotly.min.js"
    assert bundle.stat().st_size > 1_000_000 and b"plotly" in bundle.read_bytes()[:2000].lower()
    assert _json(capsys)["heatmap"] == str(out / "dcsn_heatmap.html")
    with pytest.raises(SystemExit):
        main([*argv, "--plotlyjs", "cdn"])
