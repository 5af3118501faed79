"""The unit_roles experiment ("what do capability neurons do?"): its per-neuron counts and set shares
equal a hand computation on a planted neuron, and its quick run gives a complete table with chance levels."""

from __future__ import annotations

import math

import pytest
import torch
from planting import plant

from capinterp.arch.model import load_model
from capinterp.core.example import Example
from capinterp.experiments import EXPERIMENTS, Context
from capinterp.experiments import unit_roles as UR
from capinterp.units.neurons import NeuronSet

PLANTED = (1, 5)
OTHER = (2, 9)
ARITH = ["3+4=7", "2+5=7", "1+6=7", "9-2=7", "8-1=7"]
PLAIN = ["The Eiffel Tower is in Paris", "Big Ben is located in London", "The Colosseum is in Rome"]


@pytest.fixture(scope="module")
def planted():
    """A fresh tiny model whose neuron (1, 5) fires on arithmetic "...=" and writes the digit "7"."""
    model = load_model("tiny")
    target = plant(model, [Example(t[:-1], "7") for t in ARITH], [PLANTED], gain=6.0, write=3.0)
    return model, target


def _hand_promoted(model, unit, k):
    """Top-k promoted token ids: the down projection's column times the final RMSNorm's gain, then W_U."""
    layer, i = unit
    w_out = model.blocks[layer].mlp.out.original_component.weight[:, i].float()
    gain = dict(model.named_parameters())["model.norm._original_component.weight"].float()
    return torch.topk((w_out * gain) @ model.W_U.float(), k).indices.tolist()


def _hand_arith_contexts(model, unit, texts, is_arith, k):
    """Brute force: every token's activation in each text alone, the k largest (text, position)."""
    layer, i = unit
    found = []
    for t, text in enumerate(texts):
        ids = model.to_tokens(text)
        _, cache = model.run_with_cache(ids, names_filter=lambda n: n == f"blocks.{layer}.mlp.hook_post")
        acts = cache[f"blocks.{layer}.mlp.hook_post"][0, :, i]
        found += [(float(a), t) for a in acts]
    found.sort(key=lambda x: -x[0])
    return sum(is_arith[t] for _, t in found[:k])


def test_counts_and_shares_equal_a_hand_computation(planted):
    model, target = planted
    texts, is_arith = ARITH + PLAIN, [True] * len(ARITH) + [False] * len(PLAIN)
    crit = UR.Criteria(k=5, m_digits=1, m_answers=1, m_contexts=4)
    targets = {"t": frozenset([target])}
    roles = UR.neuron_roles(model, [PLANTED, OTHER], texts, is_arith, targets, criteria=crit, batch_size=3)
    digits = {i for i in range(model.cfg.d_vocab) if UR.is_digit_token(model.tokenizer.decode([i]))}
    for unit in (PLANTED, OTHER):
        top = _hand_promoted(model, unit, crit.k)
        assert roles.loc[unit, "digits"] == sum(t in digits for t in top)
        assert roles.loc[unit, "answers:t"] == sum(t == target for t in top)
        assert roles.loc[unit, "arith_contexts"] == _hand_arith_contexts(model, unit, texts, is_arith, crit.k)
    # the planted neuron: "7" is its top promoted token and it fires on the arithmetic texts
    assert _hand_promoted(model, PLANTED, 1) == [target]
    assert roles.loc[PLANTED, "arith_contexts"] == crit.k
    hand = {
        "digits": sum(roles.loc[u, "digits"] >= 1 for u in (PLANTED, OTHER)) / 2,
        "answers": sum(roles.loc[u, "answers:t"] >= 1 for u in (PLANTED, OTHER)) / 2,
        "arithmetic contexts": sum(roles.loc[u, "arith_contexts"] >= 4 for u in (PLANTED, OTHER)) / 2,
    }
    assert UR.set_shares(roles, [PLANTED, OTHER], "t", crit) == hand
    assert UR.set_shares(roles, [PLANTED], "t", crit) == dict.fromkeys(UR.PROPERTIES, 1.0)


def test_table_compares_the_located_share_with_random_sets(planted):
    model, target = planted
    texts, is_arith = ARITH + PLAIN, [True] * len(ARITH) + [False] * len(PLAIN)
    crit = UR.Criteria(k=5, m_digits=1, m_answers=1, m_contexts=4)
    mask = torch.zeros(model.cfg.n_layers, model.cfg.d_mlp, dtype=torch.bool)
    mask[PLANTED] = True
    ns = NeuronSet(mask)
    task = [Example(t[:-1], "7") for t in ARITH]
    table = UR.roles_table(model, {"planted": (ns, "t", task)}, texts, is_arith, n_random=4, seed=1, criteria=crit)
    assert list(table.columns) == UR.COLUMNS and table["property"].tolist() == list(UR.PROPERTIES)
    assert table["share"].tolist() == [1.0, 1.0, 1.0] and (table["n_neurons"] == 1).all()
    # the chance level: the same shares of the seeded random draws from the planted neuron's layer
    draws = [ns.random_like(1000 + r, per_layer=True) for r in range(4)]
    units = sorted({u for d in draws for u in UR._keys(d)})
    assert all(u[0] == PLANTED[0] for u in units)
    roles = UR.neuron_roles(model, units, texts, is_arith, {"t": UR.target_tokens(model, task)}, criteria=crit)
    for p, row in zip(UR.PROPERTIES, table.itertuples()):
        shares = [UR.set_shares(roles, UR._keys(d), "t", crit)[p] for d in draws]
        assert row.random_mean == pytest.approx(sum(shares) / 4)
        assert row.random_lo <= row.random_mean <= row.random_hi


def test_bad_criteria_and_corpus_are_refused(planted):
    model, _ = planted
    with pytest.raises(ValueError, match="m_contexts must be at most k"):
        UR.Criteria(k=5, m_contexts=6)
    with pytest.raises(ValueError, match="is_arith has 1 flags for 2 texts"):
        UR.neuron_roles(model, [PLANTED], ["a b", "c d"], [True], {})
    assert UR.is_digit_token(" 42") and not UR.is_digit_token("4a") and not UR.is_digit_token("  ")


def test_quick_run_on_tiny(tiny, tmp_path):
    res = EXPERIMENTS["unit_roles"][1](Context(tiny, quick=True, workdir=tmp_path))
    t = res.table
    assert list(t.columns) == UR.COLUMNS and "CNL (sub)" in set(t["set"])
    for row in t.itertuples():
        assert 0 <= row.share <= 1 and row.random_lo <= row.random_mean <= row.random_hi and row.n_random == 20
        assert math.isfinite(row.share)
    assert res.info["corpus"]["arithmetic"] == 60 and len(res.figure.data) == 2
    res.save(tmp_path / "out")
