"""scripts/quality_tables.py: the quality page's tables from run folders, models side by side."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from script_module import load_script

from capinterp.experiments import faithfulness as F
from capinterp.experiments import patching_agreement as PA


@pytest.fixture(scope="module")
def script():
    return load_script("quality_tables")


def _run(folder: Path, name: str, rows: list[dict], info: dict) -> Path:
    (folder / "experiments" / name).mkdir(parents=True)
    pd.DataFrame(rows).to_csv(folder / "experiments" / name / "table.csv", index=False)
    (folder / "results.json").write_text(json.dumps({"experiments": {name: {"info": {**info, "notes": "x"}}}}))
    return folder


def test_the_layouts_name_only_columns_the_experiments_write(script):
    for name, columns in (("faithfulness", F.COLUMNS), ("patching_agreement", PA.COLUMNS)):
        keys, shown = script.LAYOUT[name]
        used = set(keys) | {v for _, v, _ in shown} | {c for _, _, ci in shown if ci for c in ci}
        assert used <= set(columns), used - set(columns)


def test_models_side_by_side_with_intervals_and_gaps(script, tmp_path, capsys):
    base = {"task": "facts", "component": "FFN neuron", "ablation": "zero", "n_units": 64}
    a = [{**base, "method": "kn (IG)", "pearson": 0.91, "pearson_lo": 0.8, "pearson_hi": 0.95, "spearman": 0.5}]
    a.append({**base, "method": "AtP|x", "pearson": -0.2, "pearson_lo": -0.5, "pearson_hi": 0.1, "spearman": 0.1})
    b = [{**base, "method": "kn (IG)", "pearson": 0.99, "pearson_lo": 0.98, "pearson_hi": 1.0, "spearman": 0.9}]
    runs = {
        "gemma3": _run(tmp_path / "a", "patching_agreement", a, {"n_facts": 64}),
        "smollm2": _run(tmp_path / "b", "patching_agreement", b, {"n_facts": 57}),
        "qwen2": tmp_path / "unfinished",
    }
    text = script.table("patching_agreement", runs)
    lines = text.splitlines()
    assert lines[0].startswith("| task | component | method | ablation | Gemma 3 Pearson [95 % CI]")
    assert "Qwen2" not in lines[0] and "not finished" in capsys.readouterr().err
    assert (
        lines[2]
        == "| facts | FFN neuron | kn (IG) | zero | 0.91 [0.80, 0.95] | 0.50 | 64 | 0.99 [0.98, 1.00] | 0.90 | 64 |"
    )
    # a row one model lacks keeps its cells, empty; a pipe in a name is escaped
    assert lines[3] == "| facts | FFN neuron | AtP\\|x | zero | -0.20 [-0.50, 0.10] | 0.10 | 64 |  |  |  |"
    assert script.sizes("patching_agreement", runs).splitlines() == [
        'Gemma 3: {"n_facts": 64}',
        'SmolLM2: {"n_facts": 57}',
    ]


def test_a_random_band_reads_as_a_range(script, tmp_path):
    row = {"task": "facts", "method": "kn", "unit": "neuron", "cpr": 0.6, "cpr_lo": 0.4, "cpr_hi": 0.7}
    row.update(random_cpr_mean=0.2, random_cpr_p05=0.1, random_cpr_p95=0.3)
    text = script.table("faithfulness", {"smollm2": _run(tmp_path, "faithfulness", [row], {})})
    assert "| facts | kn | neuron | 0.60 [0.40, 0.70] | 0.20 (0.10 to 0.30) |  |  |  |" in text
    with pytest.raises(SystemExit, match="no run"):
        script.table("faithfulness", {"smollm2": tmp_path / "none"})
