"""The faithfulness table runs one random band per (task, unit kind) for all its methods, and an
interrupted run resumes from its cached rows without measuring them again."""

from __future__ import annotations

import sys

import pandas as pd
import pytest

import capinterp as ci
from capinterp.experiments import Context
from capinterp.experiments import faithfulness as FX

F = sys.modules["capinterp.interventions.faithfulness"]
DATA = [("3+4=", "7"), ("5+2=", "7"), ("1+6=", "7")]


def test_one_band_for_two_methods_and_rows_resume(tiny, tmp_path, monkeypatch):
    draws = []
    masks = F._unit_masks
    monkeypatch.setattr(F, "_unit_masks", lambda *a, **k: draws.append(a[2]) or masks(*a, **k))
    ctx = Context(tiny, quick=True, workdir=tmp_path)
    table = FX.faithfulness_table(ctx, {"t": (DATA, DATA, ("dcsn", "neft"))})
    assert draws.count(0) == 2 and len([d for d in draws if d > 0]) == 1  # one random band, two located sets
    assert list(table.columns) == FX.COLUMNS and table["method"].tolist() == ["dcsn", "neft"]
    # both rows carry the same band: the same random areas
    for name in ("random_cpr_mean", "random_cmd_p95", "random_ablated_area_mean"):
        assert table[name].iloc[0] == pytest.approx(table[name].iloc[1])
    assert (table["ablated_area_lo"] <= table["ablated_area"]).all()

    def refuse(*a, **k):
        raise AssertionError("a cached row was measured again")

    monkeypatch.setattr(FX, "faithfulness", refuse)
    again = FX.faithfulness_table(ctx, {"t": (DATA, DATA, ("dcsn", "neft"))})
    pd.testing.assert_frame_equal(again, table)
    with pytest.raises(AssertionError, match="measured again"):  # a new method is measured
        FX.faithfulness_table(ctx, {"t": (DATA, DATA, ("dcsn", "neft", "cnl"))})


def test_fact_bags_take_the_data_folder_after_the_builtin_facts(tiny, tmp_path, monkeypatch):
    import json

    from capinterp.data.paraphrases import builtin_paraphrases

    knowns = [{"subject": f"S{i}", "attribute": "A", "prompt": f"S{i} is in"} for i in range(30)]
    (tmp_path / "rome_knowns").mkdir()
    (tmp_path / "rome_knowns" / "known_1000.json").write_text(json.dumps(knowns + knowns[:3]))
    monkeypatch.setenv("CAPINTERP_DATA", str(tmp_path))
    seen = []

    def every_second(model, bags, *, per_fact, min_prompts, max_facts, allow_empty):  # the "known" half
        seen.append(len(bags))
        return [list(b[:per_fact]) for b in bags[::2]][:max_facts]

    monkeypatch.setattr(FX, "known_paraphrases", every_second)
    n_builtin = len(builtin_paraphrases())
    bags, counts = FX.fact_bags(Context(tiny, quick=False), n_builtin // 2 + 10, per_fact=3)
    assert counts == {"builtin": (n_builtin + 1) // 2, "known_1000": len(bags) - (n_builtin + 1) // 2}
    assert len(bags) == n_builtin // 2 + 10 and all(1 <= len(b) <= 3 for b in bags)
    assert len({b[0].prompt for b in bags}) == len(bags)  # the repeated known facts are not counted twice
    assert all(b[0].meta["subject"] for b in bags)
    few, counts = FX.fact_bags(Context(tiny, quick=False), 2, per_fact=3)
    assert len(few) == 2 and counts["known_1000"] == 0 and sum(seen[-2:]) <= n_builtin + 64


def test_band_resumes_chunk_by_chunk_after_an_interruption(tiny, tmp_path, monkeypatch):
    """A full run's random band is saved chunk by chunk: a run killed midway loses only its chunk,
    and the resumed band equals one measured in a single pass."""
    from capinterp.interventions import resumable_rows as RR

    ranking = ci.DCSN(tiny, progress=False).fit(DATA).scores_
    kw = dict(ks=[0.05, 0.5], random_sets=3, bootstrap=0)
    whole = F.faithfulness(tiny, ranking, DATA, **kw)  # 2 + 2 x 2 x 3 = 14 band masks, one pass
    ckpt = tmp_path / "band.ckpt"
    monkeypatch.setattr(RR, "CHUNK", 4)
    calls = []
    real = F.ablated_metric

    def dies_on_third(model, items, keep, **k):
        calls.append(len(keep))
        if len(calls) == 3:
            raise KeyboardInterrupt  # the run is stopped during the band's third chunk
        return real(model, items, keep, **k)

    monkeypatch.setattr(F, "ablated_metric", dies_on_third)
    with pytest.raises(KeyboardInterrupt):
        F.faithfulness(tiny, ranking, DATA, checkpoint=ckpt, **kw)
    assert calls == [4, 4, 4] and ckpt.exists()
    calls.clear()
    monkeypatch.setattr(F, "ablated_metric", lambda *a, **k: calls.append(len(a[2])) or real(*a, **k))
    resumed = F.faithfulness(tiny, ranking, DATA, checkpoint=ckpt, **kw)
    assert calls == [4, 2, 4]  # the band's last 6 masks in two chunks, then the 4 located ones
    assert resumed.band.values == pytest.approx(whole.band.values, abs=1e-6)
    assert resumed.cpr == pytest.approx(whole.cpr, abs=1e-6)
    assert resumed.random_cpr == pytest.approx(whole.random_cpr, abs=1e-6)
    calls.clear()
    other = F.faithfulness(tiny, ranking, DATA[:2], checkpoint=ckpt, **kw)  # other data: the file is replaced
    assert calls[:-1] == [4, 4, 4, 2] and other.band.values.shape[1] == 2
