"""``capinterp localize --certify B``: the certificate of the located set written beside the result
(the same numbers ``ci.certify`` gives on the same data), its line in the printed JSON, and every bad
value refused before the model loads."""

from __future__ import annotations

import json

import pytest

import capinterp as ci
from capinterp.app.args import build_parser, check_args
from capinterp.app.cli import main
from capinterp.units.neurons import NeuronSet

ARGV = ["localize", "--model", "tiny", "--method", "dcsn", "--n", "6", "--examples", "all"]


def test_localize_certify_writes_the_certificate_beside_the_result(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("CAPINTERP_DATA", raising=False)
    out = tmp_path / "o"
    argv = [*ARGV, "--certify", "8", "--certify-tau", "0.001", "--out", str(out)]
    assert main(argv) == 0
    res = json.loads(capsys.readouterr().out)
    saved = json.loads((out / "dcsn_certificate.json").read_text())
    assert res["certificate"]["file"] == str(out / "dcsn_certificate.json")
    located = NeuronSet.load(out / "dcsn_neurons.capi")
    assert saved["n_located"] == len(located) and saved["sampled"] == 8 and saved["tau"] == 0.001
    args = build_parser().parse_args(argv)
    check_args(args)  # the same generated data the command localized on
    scores = ci.NeuronScores.load(out / "dcsn_scores.capi")  # the fit's own scores order the draw
    again = ci.certify(ci.load_model("tiny"), located, args.dataset, budget=8, tau=0.001, scores=scores)
    assert res["certificate"]["summary"] == again.summary()
    assert saved["count_bound"] == again.count_bound and saved["total_bound"] == pytest.approx(again.total_bound)
    assert [tuple(u) for u in saved["sampled_units"]] == list(again.sampled_units)


@pytest.mark.parametrize(
    "extra, flag",
    [
        (["--certify", "0"], "--certify"),
        (["--certify", "4", "--certify-tau", "1.0"], "--certify-tau"),
        (["--certify", "4", "--certify-delta", "0"], "--certify-delta"),
        (["--certify-delta", "1.5"], "--certify-delta"),
    ],
)
def test_bad_certify_values_are_refused_before_loading(no_load, tmp_path, capsys, extra, flag):
    assert main([*ARGV, *extra, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert flag in err and len(err.strip().splitlines()) == 1
