"""``capinterp main --cards N``: the main job writes the cards page of its top located CNL neurons and
links it from its summary and its "next:" hints; ``--cards 0`` writes none; a bad N is refused first."""

from __future__ import annotations

import json

import pytest

from capinterp.app.cli import main
from capinterp.units.neurons import NeuronScores, NeuronSet

BASE = ["main", "--model", "tiny", "--threads", "1", "--n", "3", "--examples", "all", "--batch-size", "4"]
BASE += ["--random-seeds", "1", "--steps", "4"]


def _run(capsys, argv):
    rc = main(argv)
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def test_main_writes_and_links_the_cards_of_its_top_neurons(tmp_path, capsys):
    out = tmp_path / "m"
    rc, stdout, err = _run(capsys, [*BASE, "--cards", "2", "--out", str(out)])
    assert rc == 0, err
    res = json.loads(stdout)
    located = NeuronSet.load(out / "cnl_neurons.capi")
    assert len(located) >= 1  # the tiny model's CNL locates neurons on these 3 problems
    page, data = out / "cnl_cards.html", out / "cnl_cards.json"
    assert res["cards"]["page"] == str(page) and res["cards"]["json"] == str(data)
    assert page.is_file() and page.stat().st_size > 1000 and res["cards"]["n"] == min(2, len(located))
    # the cards are the located neurons with the highest CNL scores, best first
    scores = NeuronScores.load(out / "cnl_scores.capi").scores
    keys = [(int(l), int(i)) for l, i in located.mask.nonzero().tolist()]
    best = sorted(keys, key=lambda u: (-float(scores[u]), u))[: res["cards"]["n"]]
    cards = json.loads(data.read_text())["cards"]
    assert [f"L{l} N{i}" for l, i in best] == [c["label"] for c in cards]
    assert all(c["label"] in page.read_text() for c in cards)
    assert f"open {page} in a browser" in err and "cards of the top" in err  # the link in the hints
    assert json.loads((out / "summary.json").read_text())["cards"] == res["cards"]


def test_main_cards_zero_writes_no_page(tmp_path, capsys):
    out = tmp_path / "m"
    rc, stdout, err = _run(capsys, [*BASE, "--cards", "0", "--out", str(out)])
    assert rc == 0, err
    assert "cards" not in json.loads(stdout) and not (out / "cnl_cards.html").exists()
    assert "cnl_cards" not in err


@pytest.mark.parametrize("bad", ["-1", "x"])
def test_main_bad_cards_is_refused_before_the_model_loads(tmp_path, capsys, monkeypatch, bad):
    import capinterp.app.main_job as mj

    monkeypatch.setattr(mj, "load_model", lambda *a, **k: pytest.fail("the model loaded"))
    try:
        rc = main([*BASE, "--cards", bad, "--out", str(tmp_path / "m")])
    except SystemExit as exc:  # argparse refuses a non-integer
        rc = exc.code
    assert rc == 2 and "--cards" in capsys.readouterr().err
