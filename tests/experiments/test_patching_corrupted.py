"""Patching agreement's corrupted-prompt variant (clean -> corrupted at every position) and its
bootstrap intervals: a planted neuron's corrupted effect equals a hand-written patch, AtP takes the
same reference, units without a partner of their token length are refused, intervals cover."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from planting import PLANTED, plant

import capinterp as ci
from capinterp.arch.model import neuron_hook
from capinterp.core.tokens import encode
from capinterp.data import Example
from capinterp.experiments import patching_agreement as PA
from capinterp.experiments.agreement_stats import bootstrap_ci, stat_row
from capinterp.experiments.corrupt_partners import partner_fn, partner_pairs, partners
from capinterp.experiments.neuron_atp import neuron_atp

EXAMPLES = [Example(f"{a}+{b}=", "7") for a, b in [(3, 4), (5, 2), (1, 6), (2, 5)]]
OTHERS = [Example(f"{a}*{b}=", "2") for a, b in [(3, 4), (5, 2), (1, 6), (2, 5)]]


@pytest.fixture(scope="module")
def planted():
    m = ci.load_model("tiny")
    plant(m, EXAMPLES)
    return m


def _hand_patch(m, layer, idx, partner_of):
    """m(clean) - m(neuron (layer, idx) set to its value on each example's partner), written out."""
    diffs = []
    for ex in EXAMPLES:
        it = encode(m, [ex])[0]
        bad = encode(m, [partner_of(ex)])[0]
        assert len(bad.prompt_ids) == len(it.prompt_ids)
        _, cache = m.run_with_cache(torch.tensor([bad.prompt_ids]))
        ref = cache[neuron_hook(layer)][0, :, idx]

        def patch(act, hook):
            act = act.clone()
            act[0, :, idx] = ref
            return act

        clean = m(torch.tensor([it.prompt_ids]))[0, -1].softmax(-1)[it.target_ids[0]]
        logits = m.run_with_hooks(torch.tensor([it.prompt_ids]), fwd_hooks=[(neuron_hook(layer), patch)])
        diffs.append(float(clean - logits[0, -1].softmax(-1)[it.target_ids[0]]))
    return float(np.mean(diffs))


@torch.no_grad()
def test_corrupted_effect_of_a_planted_neuron_is_the_hand_written_patch(planted):
    m = planted
    found = partners(m, EXAMPLES, EXAMPLES + OTHERS)
    assert all(p is not None and p.target == "2" for p in found)  # a different answer is preferred
    fn = partner_fn(EXAMPLES, found)
    l, i = PLANTED[0]
    group = torch.zeros(m.cfg.n_layers, m.cfg.d_mlp, dtype=torch.bool)
    group[l, i] = True
    got = PA.unit_effects(m, EXAMPLES, [group], ablation="corrupt", corrupt=fn)[0]
    zero = PA.unit_effects(m, EXAMPLES, [group])[0]
    assert got == pytest.approx(_hand_patch(m, l, i, fn), rel=1e-4, abs=1e-7)
    assert abs(got - zero) > 1e-3  # a different reference, a different effect


def test_atp_takes_the_corrupted_reference(planted):
    m = planted
    pairs = partner_pairs(m, EXAMPLES, EXAMPLES + OTHERS)
    zero, corrupted = neuron_atp(m, EXAMPLES), neuron_atp(m, pairs)
    l, i = PLANTED[0]
    assert zero[l, i] > 0 and not torch.allclose(zero, corrupted)
    # the same gradient at the clean point: the ratio of the two is the ratio of (a - ref) summed
    items = encode(m, EXAMPLES)
    assert corrupted.shape == zero.shape == (m.cfg.n_layers, m.cfg.d_mlp) and len(items) == 4


def test_no_partner_of_the_same_length_is_refused(planted):
    odd = [*EXAMPLES, Example("12+345=", "357")]
    assert partners(planted, odd)[-1] is None
    with pytest.raises(ValueError, match="no corrupted partner"):
        partner_pairs(planted, odd)
    with pytest.raises(ValueError, match="partner="):
        PA.agreement_table(planted, "t", EXAMPLES, {}, ablation="corrupted")
    with pytest.raises(ValueError, match="ablation must be one of"):
        PA.head_table(planted, "t", EXAMPLES, ablation="mean")


def test_corrupted_rows_beside_zero_rows(planted):
    m = planted
    fn = partner_fn(EXAMPLES, partners(m, EXAMPLES, EXAMPLES + OTHERS))
    kn = ci.KN(m, steps=4, rule="gauss", progress=False).fit(EXAMPLES).scores_
    tab = PA.agreement_table(m, "t", EXAMPLES, {"kn": kn}, n_top=4, n_random=4, ablation="corrupted", partner=fn)
    assert list(tab.columns) == PA.COLUMNS and set(tab["ablation"]) == {"corrupted"}
    assert set(tab["method"]) == {"kn", "AtP"} and set(tab["component"]) == {"FFN neuron", "FFN layer"}
    heads = PA.head_table(m, "t", EXAMPLES, ablation="corrupted", partner=fn, qk_fix=False, relp=False, graddrop=False)
    assert heads["n_units"].iloc[0] == m.cfg.n_layers * m.cfg.n_heads


def test_bootstrap_interval_brackets_the_estimate_and_covers():
    rng = np.random.default_rng(0)
    x = rng.normal(size=80)
    y = 0.6 * x + 0.8 * rng.normal(size=80)
    row = stat_row(x, y, seed=1)
    for k in ("pearson", "spearman"):
        assert row[f"{k}_lo"] < row[k] < row[f"{k}_hi"]
    assert row == stat_row(x, y, seed=1)  # seeded
    # coverage of the true Pearson (0.6) by the 95% percentile interval, 40 draws of 60 units
    hits = 0
    for t in range(40):
        x = rng.normal(size=60)
        y = 0.6 * x + 0.8 * rng.normal(size=60)
        lo, hi, _, _ = bootstrap_ci(x, y, n_boot=200, seed=t)
        hits += lo <= 0.6 <= hi
    assert (
        hits >= 33
    )  # 95% nominal: fewer than 33 of 40 has probability < 0.1% (1.3% at 92% coverage); seeded, so it does not flake
    assert np.isnan(bootstrap_ci(x[:2], y[:2])[0])


@pytest.mark.parametrize("corrupted", [False, True])
def test_stair_unit_effects_equal_full_forwards(planted, corrupted):
    from capinterp.experiments.unit_stair import stair_effects

    m = planted
    L, d = m.cfg.n_layers, m.cfg.d_mlp
    groups = []
    for l, i in [*PLANTED, (0, 3), (2, 9)]:
        g = torch.zeros(L, d, dtype=torch.bool)
        g[l, i] = True
        groups.append(g)
    groups += [torch.zeros(L, d, dtype=torch.bool).index_fill_(0, torch.tensor([l]), True) for l in range(L)]
    if corrupted:
        fn = partner_fn(EXAMPLES, partners(m, EXAMPLES, EXAMPLES + OTHERS))
        pairs = partner_pairs(m, EXAMPLES, EXAMPLES + OTHERS)
        ref = PA.unit_effects(m, EXAMPLES, groups, ablation="corrupt", corrupt=fn)
        fast = stair_effects(m, [p.clean for p in pairs], groups, pairs)
    else:
        ref = PA.unit_effects(m, EXAMPLES, groups)
        fast = stair_effects(m, encode(m, EXAMPLES), groups)
    assert fast is not None and np.abs(ref).max() > 1e-4
    np.testing.assert_allclose(fast, ref, atol=1e-5, rtol=0)
