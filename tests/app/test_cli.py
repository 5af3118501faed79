import json

import pytest

from capinterp.app.cli import main


def test_info(capsys):
    assert main(["info", "--model", "tiny", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert "layers       4" in out and "d_mlp        128" in out and "blocks.3.mlp.hook_post" in out


def test_evaluate_prints_json(capsys):
    assert main(["evaluate", "--model", "tiny", "--ops", "+", "--fmt", "DG", "--n", "6"]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert res["n"] == 6 and 0 <= res["accuracy"] <= 1


def test_localize_writes_outputs(tmp_path, capsys):
    out = tmp_path / "o"
    assert main(["localize", "--model", "tiny", "--method", "dcsn", "--n", "6", "--out", str(out)]) == 0
    assert (out / "dcsn_heatmap.html").exists() and (out / "dcsn_neurons.capi").exists()
    assert json.loads(capsys.readouterr().out)["method"] == "dcsn"


def test_bad_input_is_a_clear_error(capsys):
    assert main(["evaluate", "--model", "tiny", "--n", "0"]) == 2
    assert "n must be" in capsys.readouterr().err
    assert main(["info", "--model", "no-such-model"]) == 2
    assert "unknown model" in capsys.readouterr().err
    assert main(["localize", "--model", "tiny", "--method", "nope", "--n", "2"]) == 2
    assert main(["localize", "--model", "tiny", "--method", "knowledge_circuit", "--n", "2"]) == 2
    assert "neuron localizers" in capsys.readouterr().err
    assert main(["reproduce", "--model", "tiny", "--only", "fidelity", "--data", "/no/such/dir"]) == 2
    assert "--data '/no/such/dir' is not a folder" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["evaluate", "--fmt", "XX"])
