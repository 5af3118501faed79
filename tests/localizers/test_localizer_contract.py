"""The localizer contract, checked for every registered localizer (one test per check, through
:func:`capinterp.testing.parametrize_with_checks`), and the registry itself: decorator registration,
entry points of other packages, capability filters. Nothing here names a built-in localizer's
capabilities: a newly registered localizer is picked up with no edit to this file."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pytest
import torch

from capinterp.core import validate
from capinterp.core.tokens import encode
from capinterp.localizers import available, base, get
from capinterp.localizers.base import CAPABILITY_VALUES, Localizer, register
from capinterp.testing import (
    CHECKS,
    ContractError,
    check_facts,
    check_localizer,
    contract_params,
    parametrize_with_checks,
    run_check,
    untouchable_model,
)
from capinterp.units.base import KeySet


@pytest.fixture(scope="module")
def facts(tiny):
    return check_facts(tiny)


@parametrize_with_checks(available())
def test_contract(localizer, check, tiny, facts):
    check(model=tiny, facts=facts)


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
    for cap, values in CAPABILITY_VALUES.items():  # the filters agree with each class's declared attributes
        for value in values:
            want = [n for n in names if getattr(get(n), cap) == value and type(getattr(get(n), cap)) is type(value)]
            assert available(**{cap: value}) == want, (cap, value)
    for name in names:
        assert get(name).capabilities() == {c: getattr(get(name), c) for c in CAPABILITY_VALUES}
        assert name in available(**get(name).capabilities())
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
    with pytest.raises(ValueError, match="fills_greedy"):
        register("bogus_fill")(type("Bogus", (Localizer,), {"fills_greedy": "yes"}))
    assert not {"bogus_kind", "bogus_flag", "bogus_fill"} & set(available())


class _Layers(Localizer):
    """A plugin localizer defined outside the package: the first layer, always (scope "fact").
    It needs the answers: ``encode`` refuses bare prompts and bad examples before any model work."""

    unit_kind = "layer"
    scope = "fact"

    def fit(self, data):
        examples = validate.examples(data, "Layers.fit(data)")
        validate.model(self.model)
        encode(self.model, examples)
        self._begin_fit()
        n_layers = int(self.model.cfg.n_layers)
        self.units_ = KeySet.layers([0], n_layers)
        self.scores_ = torch.zeros(n_layers)
        self._set_meta(n_samples=len(examples))
        return self


class _Experts(_Layers):
    """A plugin localizer of experts (on a dense model: one pseudo-expert per layer)."""

    unit_kind = "expert"

    def fit(self, data):
        super().fit(data)
        n_layers = int(self.model.cfg.n_layers)
        self.units_ = KeySet([(0, 0), (n_layers - 1, "shared")], "expert", ("expert", n_layers, 1, True))
        self._set_meta(n_samples=len(data))
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

    layer_localizers = available(unit_kind="layer")
    monkeypatch.setattr(importlib.metadata, "entry_points", fake)
    monkeypatch.setattr(base, "_entry_points_loaded", False)
    monkeypatch.setattr(base, "_REGISTRY", dict(base._REGISTRY))
    assert calls == []  # nothing is loaded before someone asks
    with pytest.warns(RuntimeWarning, match="'broken'.*ImportError: no module"):
        names = available()
    assert "plugin_layers" in names and "broken" not in names
    assert get("plugin_layers") is _Layers and _Layers.name == "plugin_layers"
    assert available(unit_kind="layer") == sorted([*layer_localizers, "plugin_layers"])
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


@pytest.fixture
def registry(monkeypatch):
    """A scratch copy of the registry: classes registered in a test are gone after it."""
    monkeypatch.setattr(base, "_REGISTRY", dict(base._REGISTRY))


def test_a_plugin_of_every_unit_kind_passes_the_contract(tiny, facts, registry):
    register("plugin_experts")(_Experts)
    check_localizer(_Experts, model=tiny, facts=facts)  # save / load of an expert KeySet included
    loc = _Experts(tiny, progress=False).fit(facts)
    assert loc.units_.kind == "expert" and loc.units_.meta["method"] == "plugin_experts"


class _TakesBare(_Layers):
    """Accepts a bare prompt without declaring fills_greedy (never looks at targets)."""

    def fit(self, data):
        examples = validate.examples(data, "TakesBare.fit(data)")
        encode(self.model, [e for e in examples if e.target])
        self._begin_fit()
        self.units_ = KeySet.layers([0], int(self.model.cfg.n_layers))
        self._set_meta()
        return self


class _RunsFirst(_Layers):
    """Runs the model before checking its data."""

    def fit(self, data):
        self._begin_fit()
        self.model(torch.tensor([[1, 2]]))
        return super().fit(data)


@pytest.mark.parametrize(
    ("cls", "check", "message"),
    [
        (_TakesBare, "check_bare_prompt", "fit accepted bare prompts"),
        (
            type("Claims", (_Layers,), {"fills_greedy": True}),
            "check_bare_prompt",
            "declares fills_greedy but fit refused bare prompts",
        ),
        (_RunsFirst, "check_bad_examples", r"fit ran 1 forward pass\(es\) before refusing data with empty target"),
        (_RunsFirst, "check_bad_data", r"fit ran 1 forward pass\(es\) before refusing an empty list"),
    ],
    ids=["accepts-bare", "claims-fill", "runs-first", "runs-first-shape"],
)
def test_the_data_checks_catch_a_broken_plugin(cls, check, message, tiny, facts, registry):
    register(f"broken_{check}_{cls.__name__.lower()}")(cls)
    (found,) = [c for c in CHECKS if c.__name__ == check]
    with pytest.raises(ContractError, match=f"{cls.__name__}: {check}: {message}"):
        run_check(cls, found, model=tiny, facts=facts)


def test_parametrize_with_checks_ids_and_known_failures(registry):
    register("plugin_bare")(_TakesBare)
    mark = parametrize_with_checks(["plugin_bare", _Layers], expected_failures={"check_bare_prompt": "reads no target"})
    argnames, params = mark.args
    assert argnames == ("localizer", "check")
    assert [p.id for p in params[: len(CHECKS)]] == [f"_TakesBare-{c.__name__}" for c in CHECKS]
    assert len(params) == 2 * len(CHECKS) and params[-1].values[0] is _Layers
    marked = {p.id: p.marks for p in params if p.marks}
    assert set(marked) == {"_TakesBare-check_bare_prompt", "_Layers-check_bare_prompt"}
    (xfail,) = marked["_TakesBare-check_bare_prompt"]
    assert xfail.name == "xfail" and xfail.kwargs == {"strict": True, "reason": "reads no target"}
    only = parametrize_with_checks([_Layers], expected_failures=lambda c: {"check_fit": "x"} if c is _TakesBare else {})
    assert not any(p.marks for p in only.args[1])
    with pytest.raises(ValueError, match="unknown checks \\['check_fitt'\\]"):
        parametrize_with_checks([_Layers], expected_failures={"check_fitt": "typo"})
    with pytest.raises(TypeError, match="Localizer classes or names"):
        parametrize_with_checks([int])


def test_contract_params_is_the_public_way_to_build_check_arguments():
    for name in available():
        cls = get(name)
        params = contract_params(cls, {"batch_size": 3})
        assert params["progress"] is False and params["batch_size"] == 3
        assert {k: params[k] for k in cls.check_params} == cls.check_params
        cls(untouchable_model(), **params)  # every check can construct it with these


def _optimized(module):
    """``module`` compiled as ``python -O`` compiles it (asserts stripped), in a fresh namespace."""
    ns = {"__name__": module.__name__ + "_O"}
    exec(compile(Path(module.__file__).read_text(), module.__file__, "exec", optimize=1), ns)
    return ns


def test_checks_raise_under_python_O(tiny, facts, registry):
    """The checks a user runs must not rely on ``assert`` (``python -O`` strips it)."""
    from capinterp.testing import data_checks, localizer_checks

    class Unregistered(_Layers):
        pass

    Unregistered.name = "unregistered"
    with pytest.raises(ContractError, match="Unregistered is not registered"):
        _optimized(localizer_checks)["check_declared"](Unregistered, tiny, facts, {}, None)
    register("plugin_bare")(_TakesBare)
    with pytest.raises(ContractError, match="fit accepted bare prompts"):
        _optimized(data_checks)["check_bare_prompt"](_TakesBare, tiny, facts, contract_params(_TakesBare), None)
