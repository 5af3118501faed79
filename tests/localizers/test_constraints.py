"""Declared hyper-parameter constraints (capinterp.core.constraints): the constraint types, the
merge over a class hierarchy, the check before a constructor's body, the IG keyword block declared
once, and the contract check that generates one bad value per constraint."""

from __future__ import annotations

import argparse
import inspect
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch

import capinterp as ci
from capinterp.core.constraints import (
    NO_VALIDATION,
    PATH,
    Boolean,
    Custom,
    Device,
    Interval,
    IsCallable,
    Options,
    Subset,
    Texts,
    check_value,
    constructor_parameters,
    invalid_values,
    parameter_constraints,
    validates_params,
)
from capinterp.localizers.base import Localizer
from capinterp.localizers.dataset import DatasetNeuronLocalizer
from capinterp.localizers.ig_check import IG_PARAMETER_CONSTRAINTS, IGChecked
from capinterp.localizers.query_localization import QueryLocalization
from capinterp.testing.localizer_checks import check_bad_params, untouchable_model

BUILT_IN = [
    ci.KN,
    ci.SIG,
    ci.AMIG,
    ci.CNL,
    ci.DCSN,
    ci.NeFT,
    ci.CausalTrace,
    ci.KnowledgeCircuit,
    DatasetNeuronLocalizer,
    QueryLocalization,
]
IG_CLASSES = [ci.KN, ci.SIG, ci.AMIG, ci.CNL]


# ------------------------------------------------------------------------------ constraint types
@pytest.mark.parametrize(
    "spec, value, err, match",
    [
        ([Interval(int, 1, None)], 0, ValueError, r"^steps must be an integer >= 1, got 0$"),
        ([Interval(int, 1, None)], 2.0, ValueError, "steps must be an integer >= 1, got 2.0"),
        ([Interval(int, 1, None)], True, ValueError, "steps"),
        ([Interval(int, 1, None)], None, TypeError, "steps"),
        ([Interval(int, 0, 5, closed="neither")], 5, ValueError, r"in \[1, 4\]"),
        ([Interval(float, 0, None, closed="neither")], 0, ValueError, r"steps must be > 0 \(a finite number\)"),
        ([Interval(float, 0, 1, closed="left")], 1.0, ValueError, r"in \[0, 1\)"),
        ([Interval(float, 0, 1)], float("nan"), ValueError, "steps"),
        ([Options("right", "gauss")], "mid", ValueError, "unknown steps 'mid': steps must be one of right, gauss"),
        ([Options("right", "gauss")], 1, ValueError, "unknown steps 1"),
        ([Interval(int, 1, None), "auto"], "x", ValueError, r"integer >= 1, or 'auto', got 'x'"),
        (
            [Interval(float, 0, None, closed="neither"), None],
            0,
            ValueError,
            r"^steps must be a finite number > 0, or None, got 0$",
        ),
        ([PATH, None], 3, TypeError, r"a path \(str or Path\), or None"),
        ([Boolean()], 1, TypeError, "True or False"),
        ([Texts()], "one", ValueError, "not one string"),
        ([Subset("a", "b")], ("a", "a"), ValueError, "distinct"),
        ([Device()], "no-such-device", ValueError, "steps"),
        ([Options("auto"), IsCallable()], "x", ValueError, "'auto', or a callable"),
    ],
)
def test_a_broken_constraint_names_the_argument(spec, value, err, match):
    with pytest.raises(err, match=match):
        check_value("steps", value, spec)


@pytest.mark.parametrize(
    "spec, value, cleaned",
    [
        ([Interval(int, 1, None)], 3, 3),
        ([Interval(float, 0, 1)], 1, 1.0),
        ([Interval(float, 0, 1)], torch.tensor(0.5), 0.5),
        ([Interval(int, 1, None), "auto"], "auto", "auto"),
        ([Interval(float, 0, None, closed="neither"), None], None, None),
        ([Subset("a", "b")], "a", ("a",)),
        ([Options("auto", "noise"), IsCallable()], len, len),
        ([NO_VALIDATION], object, object),
    ],
)
def test_a_valid_value_passes_cleaned(spec, value, cleaned):
    assert check_value("x", value, spec) == cleaned


def _one_or_two(v: Any) -> Any:
    if v not in (1, 2):
        raise ValueError(f"x must be 1 or 2, got {v!r}")
    return v


def _refuse(v: Any) -> Any:
    raise ValueError("bad value")


def test_invalid_values_break_every_form_of_the_spec():
    specs: list[list[Any]] = [
        [Interval(int, 1, None), "auto"],
        [Interval(float, 0, 1, closed="left")],
        [Interval(int, None, None)],
        [Options("a", "b"), None],
        [Custom(_one_or_two, "1 or 2", bad=(3, 1))],
    ]
    for spec in specs:
        bad = invalid_values(spec)
        assert bad, spec
        for v in bad:
            with pytest.raises((ValueError, TypeError)):
                check_value("x", v, spec)
    assert 1 not in invalid_values(specs[-1])  # a "bad" value the check accepts is left out
    assert {0, 2.5} <= set(invalid_values([Interval(int, 1, None)]))
    assert invalid_values([NO_VALIDATION]) == []


# ------------------------------------------------------------------------ declared by every class
@pytest.mark.parametrize("cls", BUILT_IN, ids=lambda c: c.__name__)
def test_every_constructor_keyword_is_declared(cls):
    declared = parameter_constraints(cls)
    assert set(declared) == set(constructor_parameters(cls))
    for spec in declared.values():
        invalid_values(spec)  # well formed: every item a constraint


@pytest.mark.parametrize("cls", BUILT_IN, ids=lambda c: c.__name__)
def test_the_defaults_meet_the_declarations(cls):
    declared = parameter_constraints(cls)
    for klass in cls.__mro__:
        init = vars(klass).get("__init__")
        if init is None or klass is object:
            continue
        for p in inspect.signature(init).parameters.values():
            if p.default is not p.empty and p.name in declared:
                check_value(p.name, p.default, declared[p.name])


def test_constraints_merge_over_the_hierarchy():
    sig, kn = parameter_constraints(ci.SIG), parameter_constraints(ci.KN)
    assert sig["positions"] is not parameter_constraints(ci.CNL)["positions"]
    assert sig["steps"] is kn["steps"] is IG_PARAMETER_CONSTRAINTS["steps"]
    assert parameter_constraints(ci.CNL)["batch_size"] == parameter_constraints(DatasetNeuronLocalizer)["batch_size"]
    assert len(parameter_constraints(ci.KN)["batch_size"]) == 1  # the base's: no "auto"
    m = untouchable_model()
    assert ci.CNL(m, batch_size="auto").batch_size == "auto"
    with pytest.raises(ValueError, match="batch_size"):
        ci.KN(m, batch_size="auto")


def test_the_ig_keyword_block_is_declared_once():
    for cls in IG_CLASSES:
        own = set(inspect.signature(vars(cls)["__init__"]).parameters)
        assert not own & (set(IG_PARAMETER_CONSTRAINTS) - {"invariance"}), cls  # SIG: its own default
        assert issubclass(cls, IGChecked) and set(IG_PARAMETER_CONSTRAINTS) <= set(constructor_parameters(cls))


@pytest.mark.parametrize("cls", IG_CLASSES, ids=lambda c: c.__name__)
def test_ig_keywords_are_stored_and_round_trip(cls):
    m = untouchable_model()
    rule = "gauss" if cls is ci.SIG else "adaptive"
    loc = cls(m, steps=3, rule=rule, objective="logprob", tol=0.01, max_steps=64, completeness_tol=0.5, progress=False)
    got = loc.get_params()
    assert {k: got[k] for k in ("steps", "rule", "objective", "tol", "max_steps", "completeness_tol")} == {
        "steps": 3,
        "rule": rule,
        "objective": "logprob",
        "tol": 0.01,
        "max_steps": 64,
        "completeness_tol": 0.5,
    }
    again = cls(m, **got, progress=False)
    assert again.get_params() == got and repr(again) == repr(loc) and not m.touched
    config = loc._ig_config(1) if cls is ci.CNL else loc._ig_config()
    assert (config.steps, config.rule, config.objective, config.completeness_tol) == (3, rule, "logprob", 0.5)


def test_defaults_are_todays():
    m = untouchable_model()
    assert ci.SIG(m).invariance == "off" and ci.KN(m).invariance == "auto" and ci.AMIG(m).invariance == "auto"
    assert ci.KN(m).batch_size == ci.SIG(m).batch_size == ci.AMIG(m).batch_size == ci.CNL(m).batch_size == 64
    assert ci.SIG(m).positions == "prompt" and ci.CNL(m).positions == "answer"
    assert ci.CNL(m).sigma == 6.0 and ci.KN(m).threshold == 0.2


def test_the_cli_sees_keywords_passed_on():
    from capinterp.app.args import ig_kwargs

    args = argparse.Namespace(rule="gauss", steps=4)
    for cls in IG_CLASSES:
        assert ig_kwargs(args, cls)["rule"] == "gauss"
    with pytest.raises(ValueError, match="no such setting"):
        ig_kwargs(args, ci.DCSN)


# ------------------------------------------------------------------- checked before the body runs
class _Recording(Localizer):
    _parameter_constraints: ClassVar[dict[str, list[Any]]] = {"alpha": [Interval(float, 0, 1)]}
    ran: ClassVar[list[str]] = []

    def __init__(self, model: Any, *, alpha: float = 0.5, **kwargs: Any) -> None:
        self.ran.append("body")
        super().__init__(model, **kwargs)
        self.alpha = alpha


def test_a_bad_value_is_refused_before_the_body_runs():
    _Recording.ran.clear()
    m = untouchable_model()
    for kw, name in (({"alpha": 2.0}, "alpha"), ({"batch_size": 0}, "batch_size"), ({"progress": "yes"}, "progress")):
        with pytest.raises((ValueError, TypeError), match=name):
            _Recording(m, **kw)
    assert _Recording.ran == [] and not m.touched
    assert _Recording(m, alpha=1).alpha == 1 and _Recording.ran == ["body"]
    assert inspect.signature(_Recording.__init__).parameters["alpha"].default == 0.5  # functools.wraps


def test_validates_params_on_any_class():
    class Plain:
        _parameter_constraints: ClassVar[dict[str, list[Any]]] = {"k": [Interval(int, 1, None)]}

        @validates_params
        def __init__(self, *, k: int = 1) -> None:
            self.k = k

    assert Plain(k=2).k == 2
    with pytest.raises(ValueError, match="k must be an integer >= 1"):
        Plain(k=0)
    with pytest.raises(TypeError, match="unexpected keyword"):
        Plain(j=1)  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="tau"):
        QueryLocalization(untouchable_model(), tau=2)


# ------------------------------------------------------------------------------- contract check
def _contract(cls: type) -> None:
    check_bad_params(cls, untouchable_model(), [], {"progress": False}, Path("."))


def test_the_contract_passes_every_built_in_and_refuses_an_undeclared_keyword():
    for cls in (ci.KN, ci.SIG, ci.AMIG, ci.CNL, ci.DCSN, ci.NeFT, ci.CausalTrace, ci.KnowledgeCircuit):
        _contract(cls)

    class Undeclared(Localizer):
        def __init__(self, model: Any, *, gamma: float = 1.0, **kwargs: Any) -> None:
            super().__init__(model, **kwargs)
            self.gamma = gamma

    with pytest.raises(AssertionError, match=r"declares no constraint for \['gamma'\]"):
        _contract(Undeclared)

    class Stale(_Recording):
        _parameter_constraints: ClassVar[dict[str, list[Any]]] = {"beta": [Interval(int, 1, None)]}

    with pytest.raises(AssertionError, match=r"does not take"):
        _contract(Stale)


def test_the_contract_catches_a_constraint_not_enforced():
    class Loose(_Recording):
        pass

    Loose.__init__ = _Recording.__dict__["__init__"].__wrapped__  # type: ignore[attr-defined,method-assign]
    with pytest.raises(AssertionError, match=r"alpha=.* was accepted"):
        _contract(Loose)

    class Vague(_Recording):
        _parameter_constraints: ClassVar[dict[str, list[Any]]] = {"alpha": [Custom(_refuse, "anything", bad=(1,))]}

    with pytest.raises(AssertionError, match="refused without naming it"):
        _contract(Vague)


def test_a_mixin_constructor_is_checked_too():
    from capinterp.localizers.base import Localizer
    from capinterp.localizers.ig_check import IGChecked

    class Mixed(IGChecked, Localizer):  # no __init__ of its own: IGChecked's runs
        pass

    with pytest.raises(ValueError, match="steps"):
        Mixed(None, steps=0)


def test_a_mistyped_keyword_names_the_class_called_and_what_it_takes():
    import capinterp as ci

    with pytest.raises(TypeError, match=r"^CNL\(\) got an unexpected keyword argument 'stepz'; it takes: .*steps"):
        ci.CNL(None, stepz=3)
    with pytest.raises(TypeError, match=r"^KN\(\) got an unexpected keyword argument"):
        ci.KN(None, nope=1)


@pytest.mark.parametrize("name", ["kn", "cnl", "sig", "amig", "dcsn"])
def test_the_signature_shows_every_keyword(name):
    import inspect

    from capinterp.core.constraints import constructor_parameters
    from capinterp.localizers import get

    cls = get(name)
    shown = list(inspect.signature(cls).parameters)
    assert shown[0] == "model" and sorted(shown[1:]) == sorted(constructor_parameters(cls))
