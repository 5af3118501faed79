"""The rome_layers and ql_localizers experiments' pieces on tiny models (real runs: docs/results.md)."""

import numpy as np
import pytest
from fact_planting import FACT_A, FACT_B, plant_facts

import capinterp as ci
from capinterp.experiments import EXPERIMENTS
from capinterp.experiments.ql_localizers import inconsistency_table
from capinterp.experiments.rome_layers import BUILTIN, layer_frame, layer_summary

TEXTS = [f"Note {i}: the clerk filed {i} reports and the courier left before noon on the long road." for i in range(40)]


@pytest.fixture(scope="module")
def planted():
    m = ci.load_model("tiny")
    plant_facts(m)
    return m


def test_registered():
    assert "rome_layers" in EXPERIMENTS and "ql_localizers" in EXPERIMENTS


def test_ql_localizers_run_on_tiny(tmp_path):
    """The registered run end to end on the planted tiny model (it answers the builtin Paris fact's
    paraphrases): one row per localizer and the intersection row, saved and loaded back."""
    from capinterp.experiments import Context, ExperimentResult
    from capinterp.experiments.ql_localizers import run

    m = ci.load_model("tiny")
    plant_facts(m)
    res = run(Context(m, quick=True))
    assert list(res.table["localizer"]) == ["kn", "sig", "amig", "intersection: II"]
    assert (res.table["n_facts"] == 1).all()
    assert set(res.info["fit_seconds"]) == {"kn", "sig", "amig"} and "paper" in res.info
    back = ExperimentResult.load(res.save(tmp_path).parent, res.name)
    assert back.table.shape == res.table.shape
    assert res.info["ig_rule"] == "right"
    accurate = run(Context(m, quick=True, ig_rule="accurate"))  # every localizer, SIG included, on Gauss nodes
    assert accurate.info["ig_rule"] == "gauss" and len(accurate.table) == len(res.table)


def test_rome_layer_frame_and_summary(planted):
    frame = layer_frame(planted, BUILTIN[:1], [0, 2], texts=TEXTS, steps=3, n_prefixes=1, prefix_tokens=3)
    assert list(frame["layer"]) == [0, 2]
    assert {"efficacy_before", "efficacy_after", "paraphrase_after", "neighborhood_after"} <= set(frame.columns)
    table = layer_summary(frame, traced=[2])
    assert list(table["layer"]) == [0, 2] and list(table["traced"]) == [False, True]
    assert table[["efficacy", "paraphrase", "neighborhood"]].to_numpy().min() >= 0
    w = ci.interventions.editing.value_weight(planted, 0)[0].clone()
    layer_frame(planted, BUILTIN[:1], [0], texts=TEXTS, steps=1, n_prefixes=0)
    assert (ci.interventions.editing.value_weight(planted, 0)[0] == w).all()  # every edit is undone


def test_intersection_row_is_the_and_of_the_classes(planted):
    fits = {
        name: ci.QueryLocalization(planted, localizer=name, steps=3, tau=0.99, progress=False).fit([FACT_A, FACT_B])
        for name in ("kn", "sig")
    }
    table = inconsistency_table(fits).set_index("localizer")
    assert list(table.index) == ["kn", "sig", "intersection: II"]
    both = np.logical_and(*[~f.consistency_["consistent_static"].to_numpy(bool) for f in fits.values()])
    assert table.loc["intersection: II", "share_inconsistent_static"] == pytest.approx(both.mean())
    for name, f in fits.items():
        assert table.loc[name, "share_inconsistent_static"] == pytest.approx(f.summary()["share_inconsistent_static"])
    assert table.loc["intersection: II", "share_inconsistent_static"] <= table["share_inconsistent_static"][:2].min()


def test_rome_layers_resume_per_layer(planted, tmp_path, monkeypatch):
    """With a workdir each layer's rows are cached: a rerun edits nothing and returns the same
    table; a damaged layer file is rebuilt (that layer only)."""
    from capinterp.experiments import Context, rome_layers

    ctx = Context(planted, quick=True, workdir=tmp_path)
    kw = dict(texts=TEXTS, steps=2, n_prefixes=1, prefix_tokens=3)
    first = layer_frame(planted, BUILTIN[:1], [0, 2], ctx, **kw)
    files = sorted((tmp_path / "tables").glob("*.json"))
    assert len(files) == 2
    calls = []
    real = rome_layers.rome_counterfact
    monkeypatch.setattr(rome_layers, "rome_counterfact", lambda *a, **k: calls.append(a[2]) or real(*a, **k))
    again = layer_frame(planted, BUILTIN[:1], [0, 2], ctx, **kw)
    assert calls == [] and again.equals(first)
    files[0].write_text("{not json")
    layer_frame(planted, BUILTIN[:1], [0, 2], ctx, **kw)
    assert len(calls) == 1


def test_hase_regression_separates_layer_from_tracing_effect():
    import pandas as pd

    from capinterp.experiments.rome_layers import edit_regression, r_squared
    from capinterp.interventions.rome_eval import SCORES

    x = np.arange(10.0)
    assert r_squared(2 * x + 1, x[:, None]) == pytest.approx(1.0)
    assert np.isnan(r_squared(np.ones(10), x[:, None]))
    rng = np.random.default_rng(0)
    rows, effects = [], {}
    for case in range(12):
        for layer in range(4):
            success = 1.0 if layer < 2 else 0.0  # edit success decided by the layer alone
            rows.append({"case_id": case, "layer": layer, **{f"{s}_after": success for s in SCORES}})
            effects[case, layer] = float(rng.normal())  # tracing effect unrelated to success
    table = edit_regression(pd.DataFrame(rows), effects)
    r2 = table[table["score"] == "efficacy"].set_index("predictors")["r2"]
    assert r2["layer"] == pytest.approx(1.0) and r2["tracing effect"] < 0.2
    assert r2["layer + tracing effect"] == pytest.approx(1.0) and (table["n"] == 48).all()
    # a layer that could not edit (NaN scores: EditUnreachable) is left out, not a NaN R²
    rows += [{"case_id": c, "layer": 4, **{f"{s}_after": float("nan") for s in SCORES}} for c in range(12)]
    effects.update({(c, 4): 0.0 for c in range(12)})
    again = edit_regression(pd.DataFrame(rows), effects)
    assert (again["n"] == 48).all() and again["r2"].notna().all()
