"""Dense and MoE layers mixed in one model (DeepSeek's first_k_dense_replace): the dense layer's
neurons sit on the experts' neuron axis, padded; padding is never selected, drawn or counted."""

from __future__ import annotations

import functools

import pytest
import torch
from moe_tiny import MIXED_DENSE, load_tiny_mixed

import capinterp as ci
from capinterp.units.neurons import NeuronScores, NeuronSet, load

EX = [ci.Example("The Eiffel Tower is in the city of", " Paris"), ci.Example("Rome is the capital of", " Italy")]
DENSE = MIXED_DENSE  # the dense layer 0's neurons


@functools.cache
def _mixed():
    """Shared by the tests, which must not change its weights (plain transformers copy beside it)."""
    return load_tiny_mixed()


@functools.cache
def _kn_scores() -> NeuronScores:
    return ci.localizers.get("kn")(_mixed()[0], progress=False).fit(EX).scores_


@torch.no_grad()
def test_a_dense_first_layer_loads_and_matches_transformers():
    model, plain, tok = _mixed()
    ids = tok(EX[0].prompt, return_tensors="pt")["input_ids"]
    want = plain(ids).logits
    assert float((model(ids) - want).abs().max()) <= 1e-5 * float(want.abs().max())


def test_the_family_records_each_layers_width():
    model = _mixed()[0]
    fam = ci.family_of(model)
    width = fam.moe.width
    assert model.cfg.d_mlp == width and fam.layer_widths == (DENSE, width)
    valid = fam.valid_neurons()
    assert valid.shape == (2, width) and int(valid[0].sum()) == DENSE and bool(valid[1].all())
    assert ci.model_meta(model)["layer_widths"] == [DENSE, width]


def test_padding_neurons_score_exactly_zero():
    model = _mixed()[0]
    width = model.capinterp_family.moe.width
    for name in ("kn", "dcsn"):
        s = ci.localizers.get(name)(model, progress=False).fit(EX).scores_.scores
        assert s.shape == (2, width) and float(s[0, DENSE:].abs().max()) == 0.0 and float(s[0, :DENSE].abs().max()) > 0


def test_selection_rules_skip_padding():
    scores = _kn_scores()
    valid = scores.valid
    assert scores.padded and int(valid.sum()) == DENSE + scores.d_mlp
    real = scores.scores[valid].double()
    # sigma: mean and spread over the real neurons only; a negative threshold never picks padding
    sel = scores.select(sigma=0.5)
    assert sel.meta["selection"]["mean"] == pytest.approx(float(real.mean()))
    assert sel.meta["selection"]["spread_value"] == pytest.approx(float(real.std(correction=0)))
    for located in (sel, scores.threshold(-1e9), scores.top_k(int(valid.sum())), scores.top_k(50, by="abs")):
        assert not bool((located.mask & ~valid).any())
    assert len(scores.threshold(-1e9)) == int(valid.sum())
    with pytest.raises(ValueError):
        scores.top_k(int(valid.sum()) + 1)
    assert len(scores.to_frame()) == int(valid.sum())


def test_random_draws_and_counts_use_real_neurons_only(tmp_path):
    scores = _kn_scores()
    located = scores.top_k(10, by="abs")
    assert located.n_units == DENSE + scores.d_mlp
    for per_layer in (False, True):
        for disjoint in (False, True):
            for seed in range(20):
                r = located.random_like(seed, per_layer=per_layer, disjoint=disjoint)
                assert len(r) == 10 and not bool((r.mask & ~scores.valid).any())
    padding = torch.zeros(scores.shape, dtype=torch.bool)
    padding[0, DENSE] = True
    with pytest.raises(ValueError, match="padding"):
        NeuronSet(padding, scores.meta)
    back = load(located.save(tmp_path / "set.capi"))
    assert back == located and back.meta["layer_widths"] == located.meta["layer_widths"]
    assert torch.equal(back.valid, located.valid)


def test_widths_that_do_not_fit_are_refused():
    with pytest.raises(ValueError, match="layer_widths"):
        NeuronScores(torch.zeros(2, 8), {"layer_widths": [4, 9]})
    with pytest.raises(ValueError, match="layer_widths"):
        NeuronScores(torch.zeros(2, 8), {"layer_widths": [4]})
