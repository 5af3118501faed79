"""Attribution against exact patching: correlations are right, planted neurons agree, the
experiment runs end to end on a tiny model."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from planting import PLANTED, plant

import capinterp as ci
from capinterp.arch.model import neuron_hook
from capinterp.data import Example
from capinterp.experiments import EXPERIMENTS, Context
from capinterp.experiments import patching_agreement as PA

EXAMPLES = [Example(f"{a}+{b}=", "7") for a, b in [(3, 4), (5, 2), (1, 6), (2, 5)]]


def test_correlations_match_definitions():
    a = np.array([1.0, 2.0, 2.0, 5.0, 9.0])
    b = np.array([0.5, 1.0, 3.0, 2.0, 8.0])
    pearson, spearman = PA.correlations(a, b)
    assert pearson == pytest.approx(np.corrcoef(a, b)[0, 1])
    ra = np.array([0, 1.5, 1.5, 3, 4])  # ties share their mean rank
    rb = np.array([0, 1, 3, 2, 4])
    assert spearman == pytest.approx(np.corrcoef(ra, rb)[0, 1])
    assert np.isnan(PA.correlations(np.ones(4), a[:4])[0])


def test_effects_equal_a_hand_written_single_neuron_ablation():
    m = ci.load_model("tiny")
    plant(m, EXAMPLES)
    L, d = m.cfg.n_layers, m.cfg.d_mlp
    group = torch.zeros(L, d, dtype=torch.bool)
    group[PLANTED[0]] = True
    effect = PA.unit_effects(m, EXAMPLES, [group])[0]
    items = ci.core.tokens.encode(m, EXAMPLES)

    def mean_p(hooks):
        ps = []
        for it in items:
            logits = m.run_with_hooks(torch.tensor([it.prompt_ids]), fwd_hooks=hooks)
            ps.append(float(logits[0, -1].softmax(-1)[it.target_ids[0]]))
        return np.mean(ps)

    l, i = PLANTED[0]

    def zero(act, hook):
        act = act.clone()
        act[..., i] = 0
        return act

    with torch.no_grad():
        expected = mean_p([]) - mean_p([(neuron_hook(l), zero)])
    assert effect == pytest.approx(expected, rel=1e-4, abs=1e-7) and effect > 0.01


def test_planted_neurons_make_ig_agree_with_patching():
    m = ci.load_model("tiny")
    plant(m, EXAMPLES)
    kn = ci.KN(m, steps=8, rule="gauss", progress=False).fit(EXAMPLES).scores_
    table = PA.agreement_table(m, "t", EXAMPLES, {"kn": kn}, n_top=8, n_random=8)
    neurons = table[table["component"] == "FFN neuron"].iloc[0]
    assert neurons["pearson"] > 0.8 and neurons["n_units"] >= 9
    assert set(table["component"]) == {"FFN neuron", "FFN layer"}


def test_quick_run_on_tiny(tiny, tmp_path):
    res = EXPERIMENTS["patching_agreement"][1](Context(tiny, quick=True, workdir=tmp_path))
    assert list(res.table.columns) == PA.COLUMNS and len(res.table) >= 4
    assert ((res.table["pearson"].abs() <= 1) | res.table["pearson"].isna()).all()
    heads = res.table[res.table["component"] == "attention head"]
    assert len(heads) >= 1 and (heads["n_units"] == tiny.cfg.n_layers * tiny.cfg.n_heads).all()
    # the QK fix runs in the full variant only (its own tests: test_head_patching); RelP and GradDrop in
    # both on zero ablation, AtP alone on the quick variant's corrupted heads
    zero = heads[heads["ablation"] == "zero"]
    assert set(zero["method"]) == {"AtP", "RelP", "|AtP| vs |effect|", "AtP* (GradDrop) vs |effect|"}
    corrupted = res.table[res.table["ablation"] == "corrupted"]
    n = res.info["corrupted_examples"]
    assert set(corrupted["task"]) == {t for t, k in n.items() if k >= 2} or "circuit edge" in set(
        corrupted["component"]
    )
    if n.get("arithmetic (sub)", 0) >= 2:
        sub = corrupted[corrupted["task"] == "arithmetic (sub)"]
        assert set(sub["component"]) == {"FFN neuron", "FFN layer", "attention head"}
    stats = res.table.dropna(subset=["pearson_lo", "pearson_hi"])
    assert (stats["pearson_lo"] <= stats["pearson_hi"]).all()
    # every part is cached in tables/: a rerun (an interrupted full run resumed) measures nothing again
    assert len(list((tmp_path / "tables").glob("*.json"))) >= 2

    def measured_again(*a, **k):
        raise AssertionError("a cached part was measured again")

    with pytest.MonkeyPatch.context() as mp:
        for name in ("agreement_table", "head_table", "edge_table"):
            mp.setattr(PA, name, measured_again)
        again = EXPERIMENTS["patching_agreement"][1](Context(tiny, quick=True, workdir=tmp_path))
    pd.testing.assert_frame_equal(again.table, res.table)
    assert again.info["edge_facts"] == res.info["edge_facts"]
