"""The faithfulness experiment: every row is a real faithfulness call, and the table is complete."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from capinterp.experiments import EXPERIMENTS, Context
from capinterp.experiments import faithfulness as FX
from capinterp.interventions.faithfulness import faithfulness


def test_quick_run_on_tiny(tiny, tmp_path):
    res = EXPERIMENTS["faithfulness"][1](Context(tiny, quick=True, workdir=tmp_path))
    t = res.table
    assert list(t.columns) == FX.COLUMNS
    measured = t.dropna(subset=["cpr"])
    assert {"cnl", "dcsn"} <= set(measured["method"])
    for _, row in measured.iterrows():
        assert row["random_cpr_p05"] <= row["random_cpr_mean"] <= row["random_cpr_p95"]
        assert row["cmd"] >= 0 and math.isfinite(row["cpr"])
    # CPR and CMD of one curve add up to the area under 1 where the curve stays in [0, 1]
    assert len(res.figure.data) == 2
    res.save(tmp_path / "out")


def test_table_rows_equal_direct_calls(tiny, tmp_path):
    ctx = Context(tiny, quick=True, workdir=tmp_path)
    data = [("3+4=", "7"), ("5+2=", "7"), ("1+6=", "7")]
    table = FX.faithfulness_table(ctx, {"t": (data, data, ("dcsn", "neft"))})
    assert table["method"].tolist() == ["dcsn", "neft"] and "not in this experiment" in table["note"].iloc[1]
    scores = ctx.localize("dcsn", "faith_t", data)
    direct = faithfulness(tiny, scores, data, ks=FX.QUICK_FRACTIONS, random_sets=2, seed=0)
    assert table["cpr"].iloc[0] == pytest.approx(direct.cpr) and table["cmd"].iloc[0] == pytest.approx(direct.cmd)
    assert table["random_cpr_mean"].iloc[0] == pytest.approx(direct.random_cpr[0])
    assert pd.isna(table["cpr"].iloc[1])


def test_knowledge_circuit_row_equals_a_direct_edge_call(tiny, tmp_path):
    from capinterp.core.example import Example
    from capinterp.localizers.knowledge_circuit import KnowledgeCircuit

    assert "knowledge_circuit" not in FX.NOT_MEASURED
    facts = [
        Example("Rome is the capital of", " Italy", {"subject": "Rome"}),
        Example("Berlin is the capital of", " Germany", {"subject": "Berlin"}),
    ]
    ctx = Context(tiny, quick=True, workdir=tmp_path)
    table = FX.faithfulness_table(ctx, {"facts": (facts, facts, ("knowledge_circuit",))})
    row = table.iloc[0]
    assert row["unit"] == "edge" and row["note"] == ""
    ig = ctx.ig(3, 10)
    kc = KnowledgeCircuit(tiny, steps=ig["steps"], rule=ig["rule"], progress=False).fit(facts)
    assert row["n_units"] == kc.graph_.n_edges
    direct = faithfulness(tiny, kc.scores_, facts, ks=FX.QUICK_FRACTIONS, by="abs", random_sets=2, seed=0)
    assert row["cpr"] == pytest.approx(direct.cpr) and row["cmd"] == pytest.approx(direct.cmd)
    assert row["random_cpr_p95"] == pytest.approx(direct.random_cpr[2])
