"""The localizer contract, checked for every registered localizer (``localizers.available()``).

Each one: declares its capabilities as valid class attributes; validates ``batch_size`` before
work; ``fit(data)`` returns ``self`` with ``units_`` of the declared kind and one ``meta_`` of the
shared shape (JSON-serializable); its saved results load back equal; ``repr`` shows its
parameters; rebuilding it from ``get_params()`` gives the same parameters and the same result.
"""

from __future__ import annotations

import inspect
import json

import pytest
import torch

from capinterp.core.example import Example
from capinterp.core.tokens import TokenizationError, encode
from capinterp.localizers import available, get
from capinterp.localizers.base import SCOPES, UNIT_KINDS, Localizer
from capinterp.results.neurons import NeuronScores, NeuronSet
from capinterp.units.base import KeySet

PROMPTS = [
    ("Rome is the capital of", "Rome"),
    ("Berlin is the capital of", "Berlin"),
    ("The Eiffel Tower is in the city of", "The Eiffel Tower"),
    ("Madrid is the capital of", "Madrid"),
]
UNIT_TYPES = {"neuron": NeuronSet, "layer": KeySet, "edge": KeySet}


@pytest.fixture(scope="module")
def facts(tiny):
    """Facts whose target is the tiny model's greedy answer: every localizer accepts them."""
    out = []
    for prompt, subject in PROMPTS:
        ids = encode(tiny, [Example(prompt, " x")])[0].prompt_ids
        with torch.no_grad():
            o = int(tiny(torch.tensor([ids]))[0, -1].argmax())
        ex = Example(prompt, tiny.tokenizer.decode([o]), {"subject": subject})
        try:
            if encode(tiny, [ex], max_target_tokens=1)[0].target_ids[0] == o:
                out.append(ex)
        except TokenizationError:
            continue
    assert len(out) >= 2
    return out


@pytest.fixture(scope="module")
def fitted(tiny, facts):
    return {name: get(name)(tiny, progress=False).fit(facts) for name in available()}


def test_registry_lists_every_localizer_once():
    names = available()
    assert names == sorted(set(names)) and {"cnl", "dcsn", "kn", "causal_trace", "knowledge_circuit"} <= set(names)
    assert available(unit_kind="neuron", scope="dataset") == ["cnl", "dcsn", "neft"]
    assert available(per_query=True) == ["amig", "kn", "sig"]
    with pytest.raises(ValueError, match="unknown capability 'kind'"):
        available(kind="neuron")
    with pytest.raises(ValueError, match="unknown localizer 'nope'"):
        get("nope")


@pytest.mark.parametrize("name", available())
def test_declared_capabilities(name, tiny, tmp_path):
    cls = get(name)
    assert issubclass(cls, Localizer) and cls.name == name
    caps = cls.capabilities()
    assert caps["unit_kind"] in UNIT_KINDS and caps["scope"] in SCOPES
    assert isinstance(caps["per_query"], bool) and isinstance(caps["checkpointable"], bool)
    assert list(inspect.signature(cls.fit).parameters) == ["self", "data"]
    if cls.checkpointable:
        cls(tiny, checkpoint=tmp_path / "c.ckpt", progress=False)
    for bad in (0, -1, 2.5):
        with pytest.raises(ValueError, match="batch_size"):
            cls(tiny, batch_size=bad)


@pytest.mark.parametrize("name", available())
def test_fit_results_follow_the_contract(name, fitted, tiny, tmp_path):
    loc = fitted[name]
    cls = type(loc)
    assert isinstance(loc.units_, UNIT_TYPES[cls.unit_kind])
    if cls.unit_kind == "neuron":
        assert isinstance(loc.scores_, NeuronScores) and loc.neurons_ is loc.units_
        assert loc.scores_.meta["method"] == name
    if cls.per_query:
        n = loc.meta_["n_samples"]
        assert loc.prompt_scores_.shape[0] == n and loc.prompt_scores_.shape[1:] == loc.scores_.shape
    meta = loc.meta_
    assert meta["method"] == name and meta["params"] == loc.hyper_params() and meta["model"] == "tiny"
    assert {"model_fingerprint", "shape", "n_params"} <= set(meta)
    json.dumps(meta)  # results record it in their files
    for attr in ("scores_", "neurons_", "circuit_"):
        res = getattr(loc, attr, None)
        if not hasattr(res, "save"):
            continue
        back = type(res).load(res.save(tmp_path / f"{attr}.out"))
        assert (
            torch.equal(back.scores, res.scores) if isinstance(res, NeuronScores) else torch.equal(back.mask, res.mask)
        )
        assert back.meta["method"] == name


@pytest.mark.parametrize("name", available())
def test_params_round_trip_and_repr(name, fitted, tiny, facts):
    loc = fitted[name]
    params = loc.get_params()
    assert "progress" not in params and "model" not in params
    assert repr(loc).startswith(f"{type(loc).__name__}(") and all(f"{k}=" in repr(loc) for k in params)
    again = get(name)(tiny, **params, progress=False)
    assert again.get_params() == params and repr(again) == repr(loc)
    again.fit(facts)
    assert again.units_ == loc.units_
    if isinstance(getattr(loc, "scores_", None), NeuronScores):
        torch.testing.assert_close(again.scores_.scores, loc.scores_.scores)


def test_query_localization_takes_data_too():
    from capinterp.localizers.query_localization import QueryLocalization

    assert list(inspect.signature(QueryLocalization.fit).parameters) == ["self", "data"]
