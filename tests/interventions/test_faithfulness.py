"""Faithfulness curves: planted neurons beat chance, every number agrees with a hand-written
ablation on the plain forward, and bad input is refused before any forward pass."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from planting import PLANTED, SEVENS, plant, planted_scores

import capinterp as ci
from capinterp.arch.model import neuron_hook, neuron_shape
from capinterp.core.tokens import encode
from capinterp.data import Example
from capinterp.interventions.faithfulness import faithfulness
from capinterp.units.base import KeySet

EXAMPLES = [Example(f"{a}+{b}=", "7") for a, b in SEVENS]


@pytest.fixture(scope="module")
def planted():
    m = ci.load_model("tiny")
    plant(m, EXAMPLES)
    return m


@torch.no_grad()
def _reference(model, keep: torch.Tensor, ref: torch.Tensor) -> float:
    """Mean p(first target token): the plain model's own full logits, neurons outside ``keep``
    replaced by ``ref[0, l]`` at the first position and ``ref[1, l]`` after it, one example at a time."""

    def put(a, l):
        r = torch.cat([ref[0, l][None], ref[1, l][None].expand(a.shape[1] - 1, -1)])  # [T, d]
        return torch.where(keep[l], a, r.to(a.dtype))

    probs = []
    for it in encode(model, EXAMPLES):
        ids, target = torch.tensor([it.prompt_ids]), it.target_ids[0]
        hooks = [(neuron_hook(l), lambda a, hook, l=l: put(a, l)) for l in range(keep.shape[0])]
        logits = model.run_with_hooks(ids, fwd_hooks=hooks)
        probs.append(float(logits[0, -1].softmax(-1)[target]))
    return float(np.mean(probs))


def test_planted_neurons_are_faithful_far_above_chance(planted):
    res = faithfulness(planted, planted_scores(planted), EXAMPLES, ks=[3, 12], ablation="zero", random_sets=10)
    row = res.table.iloc[0]
    assert row["k"] == 3 and row["faithfulness"] > row["random_faithfulness_p95"] + 0.2
    # ablating the three planted neurons costs far more than ablating three random ones
    assert row["ablated"] < row["random_ablated_p05"]
    assert res.cpr > res.random_cpr[2] and res.cmd < res.random_cmd[1]
    assert res.table["k"].tolist() == [3, 12] and "CPR" in res.summary()
    fig = res.plot()
    assert len(fig.data) == 5


@pytest.mark.parametrize("ablation", ["zero", "mean"])
def test_every_point_equals_a_hand_written_ablation(planted, ablation):
    L, d = neuron_shape(planted)
    scores = planted_scores(planted)
    res = faithfulness(planted, scores, EXAMPLES, ks=[3, 40], ablation=ablation, random_sets=0)
    if ablation == "zero":
        ref = torch.zeros(2, L, d)
    else:  # means over the data's real tokens (prompt + target): first positions, and all later ones
        acts = []
        for it in encode(planted, EXAMPLES):
            _, cache = planted.run_with_cache(torch.tensor([it.ids]))
            acts.append(torch.stack([cache[neuron_hook(l)][0] for l in range(L)], 1))  # [T, L, d]
        ref = torch.stack([torch.stack([a[0] for a in acts]).mean(0), torch.cat([a[1:] for a in acts]).mean(0)])
    full = _reference(planted, torch.ones(L, d, dtype=torch.bool), ref)
    empty = _reference(planted, torch.zeros(L, d, dtype=torch.bool), ref)
    assert res.full == pytest.approx(full, rel=1e-5) and res.empty == pytest.approx(empty, rel=1e-4, abs=1e-7)
    order = torch.sort(scores.scores.flatten(), descending=True, stable=True).indices
    for k, kept, ablated in zip(res.table["k"], res.table["kept"], res.table["ablated"]):
        m = torch.zeros(L * d, dtype=torch.bool)
        m[order[:k]] = True
        assert kept == pytest.approx(_reference(planted, m.view(L, d), ref), rel=1e-4, abs=1e-7)
        assert ablated == pytest.approx(_reference(planted, ~m.view(L, d), ref), rel=1e-4, abs=1e-7)
    f = (res.table["kept"] - res.empty) / (res.full - res.empty)
    assert np.allclose(res.table["faithfulness"], f)


def test_areas_follow_the_trapezoid_rule_with_the_measured_ends(planted):
    res = faithfulness(planted, planted_scores(planted), EXAMPLES, ks=[0.25, 0.5], ablation="zero", random_sets=0)
    n = res.meta["n_units"]
    x = np.array([0.0, *res.table["k"] / n, 1.0])
    y = np.array([0.0, *res.table["faithfulness"], 1.0])
    assert res.cpr == pytest.approx(np.trapezoid(y, x)) and res.cmd == pytest.approx(np.trapezoid(np.abs(1 - y), x))
    whole = faithfulness(planted, planted_scores(planted), EXAMPLES, ks=[1.0], ablation="zero", random_sets=0)
    assert whole.table["faithfulness"].iloc[0] == pytest.approx(1.0) and whole.table["ablated"].iloc[0] == whole.empty


def test_layers_sets_and_scores(planted):
    L, _ = neuron_shape(planted)
    per_layer = torch.zeros(L)
    per_layer[[l for l, _ in PLANTED]] = 1.0
    res = faithfulness(planted, per_layer, EXAMPLES, ks=[3], ablation="zero", random_sets=3)
    assert res.meta["unit"] == "layer" and res.meta["n_units"] == L
    by_set = faithfulness(planted, KeySet.layers([l for l, _ in PLANTED], L), EXAMPLES, ablation="zero", random_sets=0)
    assert by_set.table["k"].tolist() == [3] and by_set.table["kept"].iloc[0] == pytest.approx(
        res.table["kept"].iloc[0]
    )
    top3 = planted_scores(planted).top_k(3)
    assert faithfulness(planted, top3, EXAMPLES, ablation="zero", random_sets=0).table["k"].tolist() == [3]


def test_bad_input_is_refused_before_any_forward(planted):
    scores = planted_scores(planted)
    with pytest.raises(ValueError, match="ablation"):
        faithfulness(planted, scores, EXAMPLES, ablation="resample")
    with pytest.raises(ValueError, match="logit_diff"):
        faithfulness(planted, scores, EXAMPLES, metric="logit_diff")
    with pytest.raises(ValueError, match="only 3 units"):
        faithfulness(planted, scores.top_k(3), EXAMPLES, ks=[5])
    with pytest.raises(ValueError, match="one per layer"):
        faithfulness(planted, torch.zeros(3), EXAMPLES)
    with pytest.raises(TypeError, match="circuit edges"):
        faithfulness(planted, {1, 2}, EXAMPLES)
    with pytest.raises(ValueError):
        faithfulness(planted, scores, [])
    with pytest.raises(ValueError, match="corrupted prompt"):
        faithfulness(planted, scores, EXAMPLES, ablation="corrupt")  # arithmetic has no subjects to swap


def test_rank_by_absolute_score(planted):
    scores = planted_scores(planted)
    flipped = ci.NeuronScores(-scores.scores)
    by_abs = faithfulness(planted, flipped, EXAMPLES, ks=[3], ablation="zero", random_sets=0, by="abs")
    by_score = faithfulness(planted, scores, EXAMPLES, ks=[3], ablation="zero", random_sets=0)
    assert by_abs.table["kept"].iloc[0] == pytest.approx(by_score.table["kept"].iloc[0])
    with pytest.raises(ValueError, match="by"):
        faithfulness(planted, scores, EXAMPLES, by="rank")
