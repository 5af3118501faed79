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
    assert {"cnl", "dcsn", "neft"} <= set(measured["method"])
    for _, row in measured.iterrows():
        assert row["random_cpr_p05"] <= row["random_cpr_mean"] <= row["random_cpr_p95"]
        assert row["cmd"] >= 0 and math.isfinite(row["cpr"])
        for name in ("cpr", "cmd", "ablated_area"):  # bootstrap intervals hold the estimate
            assert row[f"{name}_lo"] <= row[name] <= row[f"{name}_hi"]
    assert len(res.figure.data) == 4  # CPR and ablated area, each beside its random band
    res.save(tmp_path / "out")


def test_table_rows_equal_direct_calls(tiny, tmp_path):
    from capinterp.localizers.neft import NeFT

    ctx = Context(tiny, quick=True, workdir=tmp_path)
    data = [("3+4=", "7"), ("5+2=", "7"), ("1+6=", "7")]
    table = FX.faithfulness_table(ctx, {"t": (data, data, ("dcsn", "neft", "amig"))})
    assert table["method"].tolist() == ["dcsn", "neft", "amig"] and table["note"].tolist() == ["", "", ""]
    assert math.isfinite(table["cpr"].iloc[2])  # AMIG's baseline without a data folder: the task's own text
    scores = ctx.localize("dcsn", "faith_t", data)
    direct = faithfulness(tiny, scores, data, ks=FX.QUICK_FRACTIONS, random_sets=2, seed=0)
    assert table["cpr"].iloc[0] == pytest.approx(direct.cpr) and table["cmd"].iloc[0] == pytest.approx(direct.cmd)
    assert table["random_cpr_mean"].iloc[0] == pytest.approx(direct.random_cpr[0])
    # NeFT: the quick fine-tune's (3 SGD steps) scores, ranked like every neuron row
    neft = NeFT(tiny, steps=3, progress=False).fit(data).scores_
    direct = faithfulness(tiny, neft, data, ks=FX.QUICK_FRACTIONS, random_sets=2, seed=0)
    row = table.iloc[1]
    assert row["unit"] == "neuron" and math.isfinite(row["cpr"]) and math.isfinite(row["cmd"])
    assert row["cpr"] == pytest.approx(direct.cpr) and row["cmd"] == pytest.approx(direct.cmd)


def _hand_cas(tiny, bags, steps, rule):
    """CAS summed over facts, written out: per query KN's IG map divided by its max, mean - std."""
    from capinterp.localizers.kn import KN

    total = 0
    for bag in bags:
        per = KN(tiny, steps=steps, rule=rule, progress=False).fit(bag).prompt_scores_.double()
        per = per / per.flatten(1).max(dim=1).values.clamp_min(1e-30)[:, None, None]
        total = total + per.mean(0) - (per - per.mean(0)).pow(2).mean(0).sqrt()
    return total.float()


def test_query_localization_row_is_summed_cas(tiny, tmp_path):
    from capinterp.core.example import Example
    from capinterp.units.neurons import NeuronScores

    bags = [
        [Example("Rome is the capital of", " Italy"), Example("The capital of Italy is", " Italy")],
        [Example("Paris is in", " France"), Example("Paris lies in", " France"), Example("Paris:", " France")],
    ]
    facts = [b[0] for b in bags]
    ctx = Context(tiny, quick=True, workdir=tmp_path)
    with pytest.raises(ValueError, match="paraphrase bags"):
        FX.faithfulness_table(ctx, {"facts": (facts, facts, ("query_localization",))})
    table = FX.faithfulness_table(ctx, {"facts": (facts, facts, ("query_localization",))}, {"facts": bags})
    row = table.iloc[0]
    assert row["method"] == "query_localization" and row["unit"] == "neuron" and row["note"] == "CAS over 2 facts"
    assert math.isfinite(row["cpr"]) and math.isfinite(row["cmd"])
    ig = ctx.ig(3, 10)
    cas = NeuronScores(_hand_cas(tiny, bags, ig["steps"], ig["rule"]))
    direct = faithfulness(tiny, cas, facts, ks=FX.QUICK_FRACTIONS, random_sets=2, seed=0)
    assert row["cpr"] == pytest.approx(direct.cpr) and row["cmd"] == pytest.approx(direct.cmd)
    empty = FX.faithfulness_table(ctx, {"facts": (facts, facts, ("query_localization",))}, {"facts": []})
    assert pd.isna(empty["cpr"].iloc[0]) and "two known paraphrases" in empty["note"].iloc[0]


def test_knowledge_circuit_row_equals_a_direct_edge_call(tiny, tmp_path):
    from capinterp.core.example import Example
    from capinterp.localizers.knowledge_circuit import KnowledgeCircuit

    assert not FX.NOT_MEASURED  # every localizer has a row with numbers
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
