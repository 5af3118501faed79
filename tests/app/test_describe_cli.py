"""``capinterp describe`` and ``localize --cards N``: one JSON document on stdout, cards.html and
cards.json written, every bad argument a one-line error before the model loads."""

from __future__ import annotations

import json

import pytest
import torch

from capinterp.app.cli import main
from capinterp.arch.model import load_model, model_meta
from capinterp.units.base import KeySet
from capinterp.units.neurons import NeuronScores, NeuronSet


def _json(capsys) -> dict:
    return json.loads(capsys.readouterr().out)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A NeuronScores file made for the tiny model (its identity recorded), and a text file."""
    folder = tmp_path_factory.mktemp("describe")
    meta = model_meta(load_model("tiny"))
    scores = NeuronScores(torch.randn(4, 128, generator=torch.Generator().manual_seed(0)), meta=meta)
    scores.save(folder / "s.capi")
    (folder / "t.txt").write_text("The cat sat on the mat.\n\n1+2=3 and 4+5=9\n\n<b>tags</b> & more\n")
    return folder


def test_describe_writes_the_page_and_json(saved, tmp_path, capsys):
    out = tmp_path / "o"
    argv = ["describe", "--model", "tiny", "--result", str(saved / "s.capi"), "--texts", str(saved / "t.txt")]
    assert main([*argv, "--top", "3", "--k", "2", "--data", "builtin", "--ablate", "1", "--out", str(out)]) == 0
    res = _json(capsys)
    scores = NeuronScores.load(saved / "s.capi")
    top = scores.to_frame(top=3)
    assert res["units"] == [f"L{r.layer} N{r.neuron}" for r in top.itertuples()]
    assert res["n_texts"] == 3 and res["task_examples"] == 14 and res["ablated"].startswith("the top 1 ")
    page = (out / "cards.html").read_text(encoding="utf-8")
    assert all(f">{u}</a>" in page for u in res["units"]) and "<b>" not in page
    cards = json.loads((out / "cards.json").read_text())["cards"]
    assert [c["label"] for c in cards] == res["units"] and cards[0]["ablation"] is not None
    assert res["page"] == str(out / "cards.html")


def test_describe_a_layer_set_without_texts(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("CAPINTERP_DATA", raising=False)  # the built-in text, whatever the machine has
    KeySet.layers([2], n_layers=4, meta=model_meta(load_model("tiny"))).save(tmp_path / "layers.json")
    KeySet.layers([1], n_layers=4).save(tmp_path / "anonymous.json")  # records no model: refused unless asked
    argv = ["describe", "--model", "tiny", "--result", str(tmp_path / "anonymous.json"), "--out", str(tmp_path / "a")]
    assert main(argv) == 2 and "across-models" in capsys.readouterr().err
    assert main([*argv, "--across-models", "--k", "1"]) == 0 and _json(capsys)["units"] == ["layer 1"]
    assert (
        main(["describe", "--model", "tiny", "--result", str(tmp_path / "layers.json"), "--out", str(tmp_path / "o")])
        == 0
    )
    res = _json(capsys)
    assert res["units"] == ["layer 2"] and "built-in text" in res["texts_source"] and res["ablated"] == "none"


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        (["--result", "missing.capi"], "no such file"),
        (["--result", "{t}"], "no saved result"),
        (["--result", "{edges}"], "edge units"),
        (["--result", "{s}", "--texts", "missing.txt"], "not found"),
        (["--result", "{s}", "--texts", "{empty}"], "holds no text"),
        (["--result", "{s}", "--texts", "{s}"], r"\.txt or \.jsonl"),
        (["--result", "{s}", "--data", "nosuch"], "no such file"),
        (["--result", "{s}", "--top", "0"], "--top"),
        (["--result", "{s}", "--ablate", "-1"], "--ablate"),
    ],
)
def test_describe_bad_arguments_fail_before_loading(no_load, saved, tmp_path, capsys, extra, match):
    KeySet([("a0", "m1")], "edge").save(tmp_path / "edges.json")
    (tmp_path / "empty.txt").write_text("\n\n")
    names = {
        "s": saved / "s.capi",
        "t": saved / "t.txt",
        "edges": tmp_path / "edges.json",
        "empty": tmp_path / "empty.txt",
    }
    argv = ["describe", "--model", "tiny", *[a.format(**names) for a in extra], "--out", str(tmp_path / "o")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("capinterp: error:") and len(err.strip().splitlines()) == 1
    assert __import__("re").search(match, err), err


def test_localize_cards_writes_the_page_beside_the_result(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("CAPINTERP_DATA", raising=False)
    out = tmp_path / "o"
    argv = ["localize", "--model", "tiny", "--method", "dcsn", "--n", "6", "--examples", "all", "--cards", "3"]
    assert main([*argv, "--out", str(out)]) == 0
    res = _json(capsys)
    located = NeuronSet.load(out / "dcsn_neurons.capi")
    assert res["cards"]["n"] == min(3, len(located)) >= 1
    assert (out / "dcsn_cards.html").is_file() and (out / "dcsn_cards.json").is_file()
    labels = [c["label"] for c in json.loads((out / "dcsn_cards.json").read_text())["cards"]]
    assert all((int(a[1:]), int(b[1:])) in located for a, b in (lab.split() for lab in labels))


def test_localize_cards_zero_refused_before_loading(no_load, tmp_path, capsys):
    assert main(["localize", "--model", "tiny", "--cards", "0", "--out", str(tmp_path / "o")]) == 2
    assert "--cards" in capsys.readouterr().err
