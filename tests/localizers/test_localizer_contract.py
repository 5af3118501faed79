"""The localizer contract, checked for every registered localizer by :func:`capinterp.testing.check_localizer`,
and the registry itself: decorator registration, entry points of other packages, capability filters."""

from __future__ import annotations

import importlib.metadata

import pytest
import torch

from capinterp.localizers import available, base, get
from capinterp.localizers.base import Localizer, register
from capinterp.testing import check_facts, check_localizer, untouchable_model
from capinterp.units.base import KeySet


@pytest.fixture(scope="module")
def facts(tiny):
    return check_facts(tiny)


@pytest.mark.parametrize("name", available())
def test_check_localizer(name, tiny, facts):
    check_localizer(get(name), model=tiny, facts=facts)


@pytest.mark.parametrize("name", available())
def test_constructing_touches_no_model(name, tiny, monkeypatch):
    """Constructors store: no forward, no .to(), nothing read, even with device= given."""

    def refuse(*a, **k):
        raise AssertionError("the constructor ran or moved the model")

    monkeypatch.setattr(tiny, "forward", refuse)
    monkeypatch.setattr(tiny, "to", refuse)
    monkeypatch.setattr(tiny, "run_with_hooks", refuse)
    cls = get(name)
    cls(tiny, device="cpu", progress=False)
    sentinel = untouchable_model()
    cls(sentinel, device="cpu", progress=False)
    assert sentinel.touched == []


def test_query_localization_construction_is_free_too():
    from capinterp.localizers.query_localization import QueryLocalization

    sentinel = untouchable_model()
    for name in available(per_query=True):
        ql = QueryLocalization(sentinel, name, device="cpu", progress=False)
        assert ql.localizer_.model is sentinel
    assert sentinel.touched == []


def test_registry_lists_every_localizer_once():
    names = available()
    assert names == sorted(set(names)) and {"cnl", "dcsn", "kn", "causal_trace", "knowledge_circuit"} <= set(names)
    assert available(unit_kind="neuron", scope="dataset") == ["cnl", "dcsn", "neft"]
    assert available(per_query=True) == ["amig", "kn", "sig"]
    with pytest.raises(ValueError, match="unknown capability 'kind'"):
        available(kind="neuron")
    with pytest.raises(ValueError, match="unknown localizer 'nope'"):
        get("nope")
    with pytest.raises(ValueError, match="already registered"):
        register("kn")(type("Other", (Localizer,), {}))
    with pytest.raises(ValueError, match="unit_kind"):
        register("bogus_kind")(type("Bogus", (Localizer,), {"unit_kind": "head"}))
    with pytest.raises(ValueError, match="per_query"):
        register("bogus_flag")(type("Bogus", (Localizer,), {"per_query": 1}))
    assert "bogus_kind" not in available() and "bogus_flag" not in available()


class _Layers(Localizer):
    """A plugin localizer defined outside the package: the first layer, always (scope "fact")."""

    unit_kind = "layer"
    scope = "fact"

    def fit(self, data):
        from capinterp.core import validate

        examples = validate.examples(data, "Layers.fit(data)")
        self._begin_fit()
        n_layers = int(self.model.cfg.n_layers)
        self.units_ = KeySet.layers([0], n_layers)
        self.scores_ = torch.zeros(n_layers)
        self._set_meta(n_samples=len(examples))
        return self


class _FakeEntryPoint:
    def __init__(self, name, obj=None, error=None):
        self.name, self.value, self._obj, self._error = name, f"plugin:{name}", obj, error

    def load(self):
        if self._error:
            raise self._error
        return self._obj


def test_entry_points_add_localizers_lazily(monkeypatch, tiny, facts):
    calls = []

    def fake(group=None, **kw):
        calls.append(group)
        if group != base.ENTRY_POINT_GROUP:
            return []
        return [_FakeEntryPoint("plugin_layers", _Layers), _FakeEntryPoint("broken", error=ImportError("no module"))]

    monkeypatch.setattr(importlib.metadata, "entry_points", fake)
    monkeypatch.setattr(base, "_entry_points_loaded", False)
    monkeypatch.setattr(base, "_REGISTRY", dict(base._REGISTRY))
    assert calls == []  # nothing is loaded before someone asks
    with pytest.warns(RuntimeWarning, match="'broken'.*ImportError: no module"):
        names = available()
    assert "plugin_layers" in names and "broken" not in names
    assert get("plugin_layers") is _Layers and _Layers.name == "plugin_layers"
    assert available(unit_kind="layer") == ["causal_trace", "plugin_layers"]
    assert calls == [base.ENTRY_POINT_GROUP]  # loaded once
    get("kn")
    assert len(calls) == 1
    check_localizer(_Layers, model=tiny, facts=facts)


def test_check_localizer_catches_a_constructor_that_reads_the_model(tiny, facts, monkeypatch):
    monkeypatch.setattr(base, "_REGISTRY", dict(base._REGISTRY))

    @register("eager")
    class Eager(_Layers):
        def __init__(self, model, *, batch_size=8, device=None, progress=True):
            super().__init__(model, batch_size=batch_size, device=device, progress=progress)
            self.n_layers = model.cfg.n_layers  # model work in the constructor

    with pytest.raises(AssertionError, match="check_construction_is_free.*read model.cfg"):
        check_localizer(Eager, model=tiny, facts=facts)
