"""A researcher's first hour on the command line (issue 46): facts from a file (--data), help texts
that state every default and leak no markup, a missing model folder named as such, one JSON
document on stdout from the main job with a random baseline over seeds, resumed checkpoints and
IG completeness reported as information, the IG options on the command line."""

import argparse
import json
import re
from pathlib import Path

import pytest

import capinterp.arch.model as core_model
from capinterp.app.cli import DESCRIPTION, build_parser, main

ROOT = Path(__file__).resolve().parents[2]
FACTS = (
    "prompt,target,subject\n"
    "The Eiffel Tower is located in the city of,Paris,The Eiffel Tower\n"
    "The capital of Germany is,Berlin,Germany\n"
    "Michael Jordan plays the sport of,basketball,Michael Jordan\n"
)


@pytest.fixture
def facts_csv(tmp_path) -> Path:
    path = tmp_path / "facts.csv"
    path.write_text(FACTS)
    return path


def _run(capsys, argv: list[str]) -> tuple[int, str, str]:
    rc = main(argv)
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


# ----------------------------------------------------------------------------- --data


def test_localize_kn_on_a_csv_of_facts(facts_csv, tmp_path, capsys):
    out = tmp_path / "kn"
    argv = ["localize", "--model", "tiny", "--threads", "1", "--data", str(facts_csv), "--method", "kn"]
    rc, stdout, err = _run(capsys, [*argv, "--examples", "all", "--out", str(out)])
    assert rc == 0, err
    res = json.loads(stdout)
    assert res["method"] == "kn" and res["data"] == str(facts_csv)
    assert res["examples"] == {"mode": "all", "total": 3, "used": 3, "dropped": 0}
    assert (out / "kn_neurons.capi").exists() and Path(res["heatmap"]).exists()
    # KN is per fact: what it did with 3 distinct facts is said, on stderr and in the JSON
    assert "paraphrases of one fact" in res["note"] and "paraphrases of one fact" in err
    # IG completeness is information: one stderr line, one JSON field, no warning
    assert res["completeness"]["n_examples"] == 3 and res["completeness"]["rule"] == "right"
    assert "IG completeness (information" in err


def test_localize_causal_trace_and_circuit_on_a_csv_of_facts(facts_csv, tmp_path, capsys):
    common = ["--model", "tiny", "--threads", "1", "--data", str(facts_csv), "--examples", "all"]
    rc, stdout, err = _run(capsys, ["localize", *common, "--method", "causal_trace", "--out", str(tmp_path / "t")])
    assert rc == 0, err
    res = json.loads(stdout)
    assert res["unit_kind"] == "layer" and res["n_traced"] == 3 and len(res["layer_scores"]) == 4
    assert json.loads(Path(res["units"]).read_text())["layers"] == res["layers"]
    assert Path(res["heatmap"]).stat().st_size > 0
    rc, stdout, err = _run(capsys, ["localize", *common, "--method", "knowledge_circuit", "--out", str(tmp_path / "c")])
    assert rc == 0, err
    res = json.loads(stdout)
    assert res["unit_kind"] == "edge" and res["edges"] > 0 and Path(res["units"]).exists()


def test_data_problems_are_clear_errors_before_loading(tmp_path, capsys, no_load, monkeypatch):
    loc = ["localize", "--model", "tiny", "--method", "kn", "--out", str(tmp_path / "o")]
    rc, _, err = _run(capsys, [*loc, "--data", str(tmp_path / "missing.csv")])
    assert rc == 2 and "no such file" in err and "missing.csv" in err
    no_prompt = tmp_path / "bad.csv"
    no_prompt.write_text("question,target\nThe capital of France is,Paris\n")
    rc, _, err = _run(capsys, [*loc, "--data", str(no_prompt)])
    assert rc == 2 and "prompt" in err and "bad.csv" in err
    monkeypatch.delenv("CAPINTERP_DATA", raising=False)
    rc, _, err = _run(capsys, [*loc, "--data", "known_1000"])
    assert rc == 2 and "CAPINTERP_DATA" in err
    good = tmp_path / "good.csv"
    good.write_text(FACTS)
    rc, _, err = _run(capsys, [*loc, "--data", str(good), "--ops", "*"])
    assert rc == 2 and "--ops" in err


def test_evaluate_reads_facts_with_the_loaders_spacing(facts_csv, capsys):
    rc, stdout, err = _run(capsys, ["evaluate", "--model", "tiny", "--threads", "1", "--data", str(facts_csv)])
    assert rc == 0, err
    res = json.loads(stdout)
    assert res["n"] == 3 and res["data"] == str(facts_csv)


# ----------------------------------------------------------------------------- help


def _subparsers(ap: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in ap._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def test_every_help_is_plain_text_and_every_option_states_its_default():
    ap = build_parser(DESCRIPTION)
    pages = {"capinterp": ap, **_subparsers(ap)}
    assert set(pages) >= {"info", "evaluate", "localize", "reproduce", "main"}
    for name, parser in pages.items():
        text = parser.format_help()
        for markup in (":mod:", ":func:", ":data:", ":class:", "``"):
            assert markup not in text, f"{name} --help shows {markup!r}"
        for action in parser._actions:
            if not action.option_strings or isinstance(action, argparse._HelpAction):
                continue
            flag = action.option_strings[-1]
            assert action.help and action.help.strip(), f"{name} {flag} has no help text"
            if action.default is not None and action.default is not False:
                assert "default" in parser._get_formatter()._get_help_string(action), f"{name} {flag}: no default"
    assert "default: cnl" in re.sub(r"\s+", " ", pages["localize"].format_help())


def test_help_lists_every_packaged_model():
    text = _subparsers(build_parser())["info"].format_help()
    for name in [*core_model._PACKAGED, "tiny"]:
        assert name in text, f"--model help omits {name!r}"


def test_info_on_a_missing_folder_says_not_found(tmp_path, capsys, no_load):
    rc, _, err = _run(capsys, ["info", "--model", str(tmp_path / "no" / "such" / "folder")])
    assert rc == 2 and "folder not found" in err and "unknown model" not in err


def test_reproduce_list_names_papers_not_internal_references(capsys):
    rc, stdout, _ = _run(capsys, ["reproduce", "--list"])
    assert rc == 0
    listed = json.loads(stdout)
    text = " ".join(listed.values())
    assert not re.search(r"papers/\d", text)
    assert "arXiv 2502.20992" in listed["erase"]  # Huang et al. 2025, "Capability Localization"


# ----------------------------------------------------------------------------- IG options


def test_ig_options_are_checked_per_method_before_loading(tmp_path, capsys, no_load):
    loc = ["localize", "--model", "tiny", "--out", str(tmp_path / "o")]
    rc, _, err = _run(capsys, [*loc, "--method", "dcsn", "--steps", "5"])
    assert rc == 2 and "--steps" in err and "dcsn" in err
    rc, _, err = _run(capsys, [*loc, "--method", "cnl", "--tol", "0.01"])
    assert rc == 2 and "--rule adaptive" in err
    rc, _, err = _run(capsys, [*loc, "--method", "kn", "--steps", "0"])
    assert rc == 2 and "steps" in err


# ----------------------------------------------------------------------------- main job and set-up


def test_main_prints_one_json_document_with_a_random_spread_and_resumes(tmp_path, capsys):
    out = tmp_path / "m"
    argv = ["main", "--model", "tiny", "--threads", "1", "--n", "3", "--examples", "all", "--batch-size", "4"]
    argv += ["--rule", "gauss", "--steps", "4", "--random-seeds", "2", "--out", str(out)]
    rc, stdout, err = _run(capsys, argv)
    assert rc == 0, err
    res = json.loads(stdout)  # the whole of stdout is one JSON document
    assert res == json.loads((out / "summary.json").read_text())
    spread = res["erase_random_seeds"]
    assert spread["seeds"] == [0, 1] and len(spread["accuracy"]) == 2
    assert spread["accuracy_min"] == min(spread["accuracy"]) and "random" in res["note"]
    assert res["completeness"]["rule"] == "gauss" and res["completeness"]["steps"] == 4
    assert res["checkpoint_info"]["resumed"] is False and ".ckpt" in res["checkpoint_info"]["note"]
    assert "next:" in err and str(out / "cnl_heatmap.html") in err and "capinterp localize" in err
    rc, stdout, err = _run(capsys, argv)  # the same run again resumes from the checkpoint
    again = json.loads(stdout)
    assert rc == 0 and again["checkpoint_info"]["resumed"] is True
    assert again["checkpoint_info"]["examples_from_checkpoint"] == 3 and "resumed from checkpoint" in err


def test_setup_script_sends_everything_to_stderr():
    """scripts/setup.sh redirects its stdout to stderr before its first command that prints, so that
    `bash scripts/main.sh > x.json` holds only the main job's JSON."""
    lines = (ROOT / "scripts" / "setup.sh").read_text().splitlines()
    code = [ln.strip() for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]
    redirect = code.index("exec 1>&2")
    prints = re.compile(r"\bpip\b|print\(|^echo\b")
    first_output = min(i for i, ln in enumerate(code) if prints.search(ln))
    assert redirect < first_output
    main_sh = (ROOT / "scripts" / "main.sh").read_text()
    assert "scripts/setup.sh >&2" in main_sh
