"""describe(): every accepted input kind on the tiny model, the ablation effect against a direct
erase-and-evaluate, the specificity and its chance level as defined, bad input refused before any
forward pass, and a page that holds every unit and escapes every text."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch

import capinterp as ci
from capinterp.cards import Cards, UnitCard, describe
from capinterp.cards.contexts import ActivationStats, Context, activation_stats, top_contexts
from capinterp.cards.describe import CHANCE_NEURONS, _random_peers
from capinterp.cards.logit_effect import TokenEffect
from capinterp.testing import ForwardCounter

TEXTS = ["The cat sat on the mat.", "1+2=3 and 4+5=9", "<b>bold</b> & 'quotes' \"here\"", "Paris is in France."]


@pytest.fixture(scope="module")
def task():
    return ci.data.arithmetic(ops="+", n=6, seed=1)


@pytest.fixture(scope="module")
def scores(tiny):
    g = torch.Generator().manual_seed(3)
    return ci.NeuronScores(torch.randn(4, 128, generator=g))


def _run(model, units, task=None, **kw):
    kw = {"k": 3, "ablate": 0, "progress": False, **kw}
    return describe(model, units, TEXTS, task=task, **kw)


def test_neuron_scores_give_their_top_units_best_first(tiny, scores, task):
    cards = _run(tiny, scores, task, top=4, ablate=2)
    want = [tuple(r) for r in scores.to_frame(top=4)[["layer", "neuron"]].itertuples(index=False)]
    assert [c.unit for c in cards] == want
    assert [c.score for c in cards] == pytest.approx([float(scores.scores[u]) for u in want])
    assert [c.ablation is not None for c in cards] == [True, True, False, False]
    assert cards.meta["units_in_input"] == 512 and cards.meta["cards"] == 4
    frame = cards.frame
    assert list(frame["unit"]) == [c.label for c in cards] and len(frame) == 4
    for c in cards:
        assert c.kind == "neuron" and len(c.contexts) == 3 and len(c.effect.promoted) == 3
        assert c.stats.count > 0 and c.task_stats.count > 0


def test_neuron_set_and_layer_keyset(tiny):
    ns = ci.NeuronSet.from_indices([(2, 5), (0, 7), (2, 1)], 4, 128)
    cards = _run(tiny, ns)
    assert [c.unit for c in cards] == [(0, 7), (2, 1), (2, 5)] and all(c.score is None for c in cards)
    assert all(c.task_stats is None and c.specificity is None and c.chance is None for c in cards)
    layers = _run(tiny, ci.KeySet.layers([3, 1], n_layers=4))
    assert [c.unit for c in layers] == [1, 3] and all(c.kind == "layer" and c.effect is None for c in layers)
    assert all(c.contexts and c.stats.min >= 0 for c in layers)  # a norm is never negative


def test_fitted_localizer_ranked_by_its_scores(tiny, task):
    loc = ci.DCSN(tiny).fit(task)
    cards = _run(tiny, loc, top=3)
    located = sorted(loc.neurons_, key=lambda u: (-float(loc.scores_.scores[u]), u))[:3]
    assert [c.unit for c in cards] == located and cards.meta["units_in_input"] == len(loc.neurons_)
    assert cards[0].score == pytest.approx(float(loc.scores_.scores[located[0]]))


def test_fitted_causal_trace_gives_layer_cards_with_scores(tiny):
    facts = ci.data.builtin_facts(2)
    ct = ci.CausalTrace(tiny, top_k=2, require_correct=False, progress=False).fit(facts)
    cards = _run(tiny, ct, facts, ablate=1)
    assert sorted(c.unit for c in cards) == sorted(ct.layers_) and all(c.kind == "layer" for c in cards)
    assert [c.score for c in cards] == pytest.approx([float(ct.layer_scores_[c.unit]) for c in cards])
    assert cards[0].ablation is not None and cards[0].specificity is not None and cards[0].chance is None


def test_ablation_equals_a_direct_erase_and_evaluate(tiny, task):
    unit = (1, 17)
    (card,) = _run(tiny, ci.NeuronSet.from_indices([unit], 4, 128), task, ablate=1)
    base = ci.evaluate(tiny, task, batch_size=8)
    with ci.erase(tiny, ci.NeuronSet.from_indices([unit], 4, 128)):
        erased = ci.evaluate(tiny, task, batch_size=8)
    assert card.ablation["prob"] == pytest.approx(erased.mean_prob)
    assert card.ablation["delta_prob"] == pytest.approx(erased.mean_prob - base.mean_prob)
    assert card.ablation["delta_accuracy"] == pytest.approx(erased.accuracy - base.accuracy)
    assert card.ablation["delta_prob"] != 0  # the unit's erasure moves the probability at all


def test_specificity_and_its_chance_level_as_defined(tiny, task):
    units = [(2, 9), (2, 40)]
    cards = _run(tiny, ci.NeuronSet.from_indices(units, 4, 128), task)
    prompts = [e.prompt for e in task]
    peers = _random_peers(tiny, units)
    assert len(peers) == CHANCE_NEURONS and all(p[0] == 2 and p not in units for p in peers)
    corpus = top_contexts(tiny, units + peers, TEXTS, k=1, progress=False)
    on_task = activation_stats(tiny, units + peers, prompts)
    spec = [(t.mean - c.stats.mean) / c.stats.std for t, c in zip(on_task, corpus)]
    assert [c.specificity for c in cards] == pytest.approx(spec[:2])
    for c in cards:
        assert c.chance == pytest.approx({"n": 16, "mean": np.mean(spec[2:]), "q95": np.quantile(spec[2:], 0.95)})


def test_texts_from_files_and_by_default(tiny, tmp_path, task):
    txt = tmp_path / "t.txt"
    txt.write_text("first paragraph\nstill first\n\nsecond one\n")
    jl = tmp_path / "t.jsonl"
    jl.write_text(json.dumps({"text": "one"}) + "\n" + json.dumps("two") + "\n")
    ns = ci.NeuronSet.from_indices([(0, 1)], 4, 128)
    assert describe(tiny, ns, txt, k=2, ablate=0, progress=False).meta["n_texts"] == 2
    assert describe(tiny, ns, str(jl), k=2, ablate=0, progress=False).meta["n_texts"] == 2
    default = describe(tiny, ns, None, task=task, k=2, ablate=0, progress=False).meta
    assert default["texts_source"].startswith(f"{len(task)} task prompts + ") and default["n_texts"] > len(task)


@pytest.mark.parametrize(
    ("units", "texts", "kw", "err", "match"),
    [
        ("empty", TEXTS, {}, ValueError, "empty"),
        ("set", [], {}, ValueError, "no non-empty text"),
        ("set", ["  "], {}, ValueError, "no non-empty text"),
        ("set", "one text", {}, TypeError, r"pass \[text\]"),
        ("set", [1, 2], {}, TypeError, "strings"),
        ("set", "missing.txt", {}, FileNotFoundError, "not found"),
        ("set", TEXTS, {"top": 0}, ValueError, "top"),
        ("set", TEXTS, {"ablate": -1}, ValueError, "ablate"),
        ("set", TEXTS, {"k": 2.0}, ValueError, "k must"),
        ("other_model", TEXTS, {}, ValueError, "made for model"),
        ("wrong_shape", TEXTS, {}, ValueError, "layers"),
        ("edges", TEXTS, {}, ValueError, "edge units name no circuit graph"),
        ("experts", TEXTS, {}, ValueError, "dense FFNs: it has no experts"),
        ("unfitted", TEXTS, {}, ValueError, "not fitted"),
        ("junk", TEXTS, {}, TypeError, "NeuronSet, NeuronScores"),
        ("set", ["x " * 5000], {}, ValueError, "context"),
    ],
)
def test_bad_input_is_refused_before_any_forward(tiny, units, texts, kw, err, match):
    ns = ci.NeuronSet.from_indices([(0, 1)], 4, 128)
    made = {
        "empty": ns.empty_like(),
        "set": ns,
        "other_model": ci.NeuronSet(ns.mask, meta={"model": "other", "model_fingerprint": "0" * 16}),
        "wrong_shape": ci.NeuronSet.from_indices([(0, 1)], 3, 128),
        "edges": ci.KeySet([("a0", "m1")], "edge"),
        "experts": ci.KeySet([(0, 1)], "expert"),
        "unfitted": ci.DCSN(tiny),
        "junk": [(0, 1)],
    }[units]
    with ForwardCounter(tiny) as passes, pytest.raises(err, match=match):
        describe(tiny, made, texts, progress=False, **kw)
    assert passes.n == 0


def test_task_without_targets_needs_no_ablation(tiny):
    ns = ci.NeuronSet.from_indices([(0, 1)], 4, 128)
    with pytest.raises(ValueError, match="target"):
        describe(tiny, ns, TEXTS, task=[{"prompt": "1+1="}], ablate=1, progress=False)
    (card,) = describe(tiny, ns, TEXTS, task=[{"prompt": "1+1="}], ablate=0, progress=False)
    assert card.task_stats is not None and card.ablation is None


def test_page_holds_every_unit_and_escapes_text(tiny, scores, task, tmp_path):
    cards = _run(tiny, scores, task, top=5, ablate=1)
    page = cards.html()
    for c in cards:
        assert f">{c.label}</a>" in page and f'id="card-{cards._cards.index(c)}"' in page
    assert "<b>" not in page and "&lt;" in page  # the corpus' markup is shown, never parsed
    assert not re.search(r"<script[^>]+src=", page) and "http" not in page.split("<body>", 1)[1]
    path = cards.save(tmp_path / "cards.html")
    assert path.read_text(encoding="utf-8") == page
    saved = json.loads(cards.save(tmp_path / "cards.json").read_text())
    assert [d["label"] for d in saved["cards"]] == [c.label for c in cards] and saved["meta"] == cards.meta
    assert cards._repr_html_().startswith("<div>") and isinstance(cards[1:3], Cards)
    assert isinstance(cards[0], UnitCard)


def test_page_escapes_hand_made_text():
    evil = "</span><script>alert(1)</script>"
    ctx = Context(0, 1, 2.0, ("a", evil, "b"), (0.0, 2.0, -1.0), 1)
    edges = (0.0, 1.0, 2.0)
    stats = ActivationStats(3, 0.3, 1.0, 2.0, -1.0, {0.5: 0.0}, 1 / 3, (edges, (1, 2)))
    effect = TokenEffect((0, 1), ((evil, 5, 1.0),), (("<i>", 6, -1.0),), "what <b>was</b> multiplied")
    card = UnitCard((0, 1), "neuron", [ctx], stats, None, None, None, effect, 1.0, None)
    page = Cards([card], {"texts_source": evil}).html()
    assert "<script>alert" not in page and "<i>" not in page and "<b>was" not in page
    assert page.count("&lt;script&gt;alert(1)&lt;/script&gt;") >= 3  # snippet, promoted, meta, table
    assert 'class="tok focus"' in page and page.count("<rect") == 2  # the focus outlined; a bar per bin


def test_root_exports_describe():
    assert ci.describe is describe and "describe" in ci.__all__
