"""``check_localizer(cls)``: the localizer contract (docs/architecture.md), checked on a tiny model.

As scikit-learn's ``check_estimator``: a new localizer passes these checks or is not done. The
test suite runs them on every registered localizer (entry points included), one test per check
(:func:`capinterp.testing.parametrize_with_checks`). Each check is a function of
``(cls, model, facts, params, tmp)``; :data:`CHECKS` lists them in the order they run (the data
checks of :mod:`capinterp.testing.data_checks` among them), and :func:`check_localizer` names the
failing one. A check raises :class:`~capinterp.testing.contract.ContractError` (an
AssertionError that ``python -O`` does not strip).

The run is kept small: the tiny random model, a few facts whose target is the model's own greedy
answer (so every localizer accepts them), and the hyper-parameters of :func:`contract_params`:
``steps=2`` / ``samples=2`` where the constructor takes them, and the class's own
:attr:`~capinterp.localizers.base.Localizer.check_params`.
"""

from __future__ import annotations

import inspect
import json
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from capinterp.arch.model import load_model
from capinterp.circuits.graph import Circuit
from capinterp.core.constraints import constructor_parameters, invalid_values, parameter_constraints
from capinterp.core.example import Example
from capinterp.core.protocol import Model
from capinterp.core.tokens import TokenizationError, encode, encode_prompt
from capinterp.localizers.base import CAPABILITY_VALUES, Localizer, available, get
from capinterp.testing.contract import ContractError, require
from capinterp.testing.data_checks import check_bad_data, check_bad_examples, check_bare_prompt
from capinterp.units.base import KeySet, UnitSet
from capinterp.units.neurons import NeuronScores, NeuronSet

__all__ = [
    "CHECKS",
    "check_facts",
    "check_localizer",
    "contract_params",
    "default_model",
    "run_check",
    "untouchable_model",
]

#: Small settings applied when the constructor takes them (fewer IG steps, fewer noise samples).
FAST_PARAMS: dict[str, Any] = {"steps": 2, "samples": 2}
#: The meta_ fields every result records (besides ``method`` and ``params``): the model's identity.
MODEL_FIELDS: tuple[str, ...] = ("model", "model_fingerprint", "shape", "n_params")
#: The result objects a fit leaves that save to one file and load back (``units_``: of every unit kind).
RESULT_ATTRS: tuple[str, ...] = ("scores_", "neurons_", "units_", "circuit_")
SAVED_RESULTS = (NeuronScores, NeuronSet, Circuit, KeySet)  # the result types with save / load
_PROMPTS = [
    ("Rome is the capital of", "Rome"),
    ("Berlin is the capital of", "Berlin"),
    ("The Eiffel Tower is in the city of", "The Eiffel Tower"),
    ("Madrid is the capital of", "Madrid"),
]
_DEFAULT: dict[str, Any] = {}


class _Untouchable:
    """A stand-in model that records every attribute read: a constructor must read none."""

    def __init__(self) -> None:
        object.__setattr__(self, "touched", [])

    def __getattr__(self, name: str) -> Any:
        self.touched.append(name)
        raise AttributeError(f"constructor read model.{name}: constructors store, fit works")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.touched.append("__call__")
        raise ContractError("constructor ran the model")


def untouchable_model() -> Any:
    """A sentinel model; its ``touched`` list names every attribute anything read from it."""
    return _Untouchable()


def default_model() -> Model:
    """The model the checks run on when none is given: ``load_model("tiny")``, loaded once."""
    if "model" not in _DEFAULT:
        _DEFAULT["model"] = load_model("tiny")
    return _DEFAULT["model"]


def check_facts(model: Model, n: int = 3) -> list[Example]:
    """Up to ``n`` facts (with ``meta["subject"]``) whose target is ``model``'s greedy next token."""
    out = []
    for prompt, subject in _PROMPTS:
        ids = encode_prompt(model, prompt)
        with torch.no_grad():
            o = int(model(torch.tensor([ids], device=model.cfg.device))[0, -1].argmax())
        ex = Example(prompt, model.tokenizer.decode([o]), {"subject": subject, "target_from": "greedy"})
        try:
            if encode(model, [ex], max_target_tokens=1)[0].target_ids[0] == o:
                out.append(ex)
        except TokenizationError:
            continue
    if len(out) < 2:
        raise RuntimeError("check_facts: the model answers too few of the check prompts in one token")
    return out[:n]


def contract_params(cls: type[Localizer], params: dict[str, Any] | None = None) -> dict[str, Any]:
    """The hyper-parameters every check constructs ``cls`` with: :data:`FAST_PARAMS` the constructor
    takes, over them the class's :attr:`~capinterp.localizers.base.Localizer.check_params` (the hook a
    localizer defines to keep the run small and self-contained), then ``params``; ``progress=False``."""
    accepted = {n for k in cls.__mro__ if k is not object for n in inspect.signature(k.__init__).parameters}  # type: ignore[misc]  # k: a class of the MRO
    fast = {k: v for k, v in FAST_PARAMS.items() if k in accepted}
    return {**fast, **cls.check_params, **(params or {}), "progress": False}


def _results(loc: Localizer) -> dict[str, Any]:
    """The public attributes ``fit`` added (``scores_``, ``units_``, ...)."""
    return {k: v for k, v in vars(loc).items() if not k.startswith("_")}


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, UnitSet):
        return bool(a == b)
    if isinstance(a, (NeuronScores, Circuit)) and isinstance(a.scores, torch.Tensor):
        return bool(torch.equal(a.scores, b.scores))
    return True


def _mro_params(cls: type) -> set[str]:
    return {n for k in cls.__mro__ if k is not object for n in inspect.signature(k.__init__).parameters}  # type: ignore[misc]  # k: a class of the MRO


# ------------------------------------------------------------------------------------- checks
def check_declared(cls: type[Localizer], model: Model, facts: list, params: dict, tmp: Path) -> None:
    """Registered under its name, capabilities valid, ``fit(self, data)``, constructor keyword-only."""
    require(isinstance(cls, type) and issubclass(cls, Localizer), f"{cls!r} does not subclass Localizer")
    registered = cls.name in available() and get(cls.name) is cls
    require(registered, f"{cls.__name__} is not registered under its name {cls.name!r}")
    for cap, values in CAPABILITY_VALUES.items():
        value = getattr(cls, cap)
        ok = any(value is v or (isinstance(v, str) and value == v) for v in values)
        require(ok, f"{cls.__name__}.{cap} = {value!r}, not one of {values}")
    require(list(inspect.signature(cls.fit).parameters) == ["self", "data"], "fit must take (self, data)")
    sig = inspect.signature(cls.__init__).parameters
    require(list(sig)[:2] == ["self", "model"], "the constructor's first argument is the model")
    for p in list(sig.values())[2:]:
        require(p.kind in (p.KEYWORD_ONLY, p.VAR_KEYWORD), f"hyper-parameter {p.name} must be keyword-only")
    takes = _mro_params(cls)
    require(("checkpoint" in takes) == cls.checkpointable, "checkpointable says whether __init__ takes checkpoint=")


def check_construction_is_free(cls: type[Localizer], model: Model, facts: list, params: dict, tmp: Path) -> None:
    """The constructor stores: it reads nothing from the model, runs nothing, moves nothing; ``fit``
    on something that is not a model is a TypeError naming it."""
    sentinel = untouchable_model()
    extra = {"checkpoint": tmp / "free.ckpt"} if cls.checkpointable else {}
    try:
        make: Any = cls
        loc = make(sentinel, **params, **extra)
    except Exception as err:
        touched = f"it read model.{sentinel.touched[0]}" if sentinel.touched else f"{type(err).__name__}: {err}"
        raise ContractError(f"constructing on a model stand-in failed ({touched}): constructors store") from err
    require(not sentinel.touched, f"{cls.__name__}(model) read model.{sentinel.touched[:1]} in its constructor")
    require(loc.model is sentinel, "the constructor stores the model as self.model")
    try:
        loc.fit(facts)
    except TypeError as err:
        require("model" in str(err), f"fit on a non-model raised an unclear TypeError: {err}")
    else:
        raise ContractError("fit on a non-model did not raise TypeError")


def check_stores_params(cls: type[Localizer], model: Model, facts: list, params: dict, tmp: Path) -> None:
    """``get_params()`` gives back what was passed; rebuilding from it gives the same parameters and repr."""
    loc = cls(model, **params)
    got = loc.get_params()
    require("model" not in got and "progress" not in got, "get_params leaves out the model and progress")
    for k, v in params.items():
        if k in got and isinstance(v, (int, float, str, bool, type(None))):
            require(got[k] == v, f"{k}={v!r} stored as {got[k]!r}")
    again = cls(model, **got, progress=False)
    require(again.get_params() == got and repr(again) == repr(loc), "rebuilding from get_params() differs")
    require(
        repr(loc).startswith(f"{cls.__name__}(") and all(f"{k}=" in repr(loc) for k in got),
        f"repr names the class and every parameter: {loc!r}",
    )


def check_bad_params(cls: type[Localizer], model: Model, facts: list, params: dict, tmp: Path) -> None:
    """Every declared constraint is enforced: the class declares a constraint for each constructor
    keyword (``_parameter_constraints``, merged over its hierarchy:
    :func:`capinterp.core.constraints.parameter_constraints`), and each value that breaks one
    (:func:`~capinterp.core.constraints.invalid_values`: out of its interval, of the wrong type,
    not an option) is refused by the constructor with a ValueError / TypeError naming the
    parameter, before it reads anything from the model. An unknown keyword is refused too."""
    declared = parameter_constraints(cls)
    takes = constructor_parameters(cls)
    missing = [n for n in takes if n not in declared]
    require(not missing, f"{cls.__name__} declares no constraint for {missing}: add them to _parameter_constraints")
    stale = [n for n in declared if n not in takes]
    require(not stale, f"{cls.__name__} declares constraints for {stale}, which its constructor does not take")
    make: Callable[..., Localizer] = cls  # any keywords: the point is that bad ones are refused
    for name, spec in declared.items():
        for bad in invalid_values(spec):
            sentinel = untouchable_model()
            try:
                make(sentinel, **{**params, name: bad})
            except (ValueError, TypeError) as err:
                require(name in str(err), f"{name}={bad!r} refused without naming it: {err}")
            else:
                raise ContractError(f"{name}={bad!r} was accepted (declared: {spec!r})")
            require(not sentinel.touched, f"{name}={bad!r}: the constructor read model.{sentinel.touched[:1]}")
    try:
        make(untouchable_model(), **params, no_such_parameter=1)
    except (TypeError, ValueError):
        pass
    else:
        raise ContractError("an unknown keyword argument was accepted")


def check_fit(cls: type[Localizer], model: Model, facts: list, params: dict, tmp: Path) -> None:
    """``fit`` returns self; results end in ``_``; hyper-parameters unchanged; ``units_`` and ``meta_``
    as declared; per-query scores when ``per_query``; a second fit and a fresh instance agree."""
    loc: Any = cls(model, **params)
    before = loc.get_params()
    attrs = set(vars(loc))
    require(loc.fit(facts) is loc, "fit must return self")
    require(loc.get_params() == before, "fit changed a hyper-parameter")
    new = [k for k in set(vars(loc)) - attrs if not k.startswith("_")]
    require(all(k.endswith("_") for k in new), f"fit set attributes not ending in '_': {sorted(new)}")
    units = loc.units_
    require(
        isinstance(units, UnitSet) and units.kind == cls.unit_kind,
        f"units_ is a {type(units).__name__} of kind {getattr(units, 'kind', None)!r}, declared {cls.unit_kind!r}",
    )
    if cls.unit_kind == "neuron":
        require(loc.neurons_ is units and hasattr(loc, "scores_"), "neuron localizers leave scores_ and neurons_")
        require(loc.scores_.meta["method"] == cls.name, "scores_.meta['method'] is the registry name")
    meta = loc.meta_
    require(
        meta["method"] == cls.name and meta["params"] == loc.hyper_params(),
        "meta_ method / params: build it with _set_meta",
    )
    missing = [f for f in MODEL_FIELDS if f not in meta]
    require(not missing, f"meta_ lacks the model fields {missing}: build it with _set_meta")
    try:
        json.dumps(meta)  # results record it in their files
    except (TypeError, ValueError) as err:
        raise ContractError(f"meta_ is not JSON-able: {err}") from err
    has_prompt_scores = hasattr(loc, "prompt_scores_")
    require(
        has_prompt_scores == cls.per_query, f"per_query={cls.per_query} but prompt_scores_ set: {has_prompt_scores}"
    )
    if cls.per_query:
        require(loc.prompt_scores_.shape == (len(facts), *loc.scores_.shape), "prompt_scores_ is [n, n_layers, d_mlp]")
    first = _results(loc)
    loc.fit(facts)  # refit: the same result (fixed seeds, no state carried over)
    fresh = cls(model, **params).fit(facts)
    for name, value in first.items():
        for other in (getattr(loc, name), getattr(fresh, name)):
            require(_same(value, other), f"{name} differs between two fits with the same seed")


def _load(res: Any, path: Path, model: Model) -> Any:
    """``res`` read back from ``path``, checked against ``model`` (a KeySet subclass loads as a KeySet)."""
    loader = KeySet.load if isinstance(res, KeySet) else type(res).load
    return loader(path, model=model)


def check_save_load(cls: type[Localizer], model: Model, facts: list, params: dict, tmp: Path) -> None:
    """Every result object (``scores_``, ``neurons_``, ``circuit_``, and ``units_`` of every unit kind:
    neurons, layers, edges, experts) saves and loads back equal, with the same ``method`` and model
    identity, and loading it with ``model=`` the model it was fitted on is accepted (so ``units_``
    records ``meta_``: :meth:`~capinterp.localizers.base.Localizer._set_meta` gives it to a KeySet
    set before it is called; one built later takes it with ``KeySet.with_meta(meta_)``)."""
    loc = cls(model, **params).fit(facts)
    saved = 0
    for name in RESULT_ATTRS:
        res: Any = getattr(loc, name, None)
        if res is None or (name != "units_" and not isinstance(res, SAVED_RESULTS)):
            continue
        require(isinstance(res, SAVED_RESULTS), f"{name} is a {type(res).__name__}, which has no save / load")
        back = _load(res, res.save(tmp / f"{name}.out"), model)
        require(_same(res, back), f"{name} changed through save / load")
        if isinstance(res, (NeuronSet, Circuit)):
            require(torch.equal(back.mask, res.mask), f"{name}.mask changed through save / load")
        for key in ("method", "model_fingerprint"):
            require(back.meta.get(key) == res.meta.get(key), f"{name}.meta[{key!r}] changed through save / load")
        require(back.meta.get("method") == cls.name, f"{name}.meta['method'] is not {cls.name!r}: record meta_")
        saved += 1
    require(saved >= 1, "fit left no units_")
    if cls.unit_kind == "neuron":
        require(saved >= 3, "a neuron localizer's scores_ and neurons_ save and load")


def check_checkpoint(cls: type[Localizer], model: Model, facts: list, params: dict, tmp: Path) -> None:
    """``checkpointable``: a fit with ``checkpoint=`` writes it, and a second fit resumes to the same result."""
    if not cls.checkpointable:
        return
    path = tmp / f"{cls.name}.ckpt"
    make: Any = cls  # checkpointable classes take checkpoint=
    first = make(model, **params, checkpoint=path).fit(facts)
    require(path.exists(), "a checkpointable fit wrote no checkpoint")
    again = make(model, **params, checkpoint=path).fit(facts)
    require(again.units_ == first.units_, "a resumed fit gave other units_")


#: Every check, in the order :func:`check_localizer` runs them.
CHECKS: tuple[Callable[..., None], ...] = (
    check_declared,
    check_construction_is_free,
    check_stores_params,
    check_bad_params,
    check_bad_data,
    check_bad_examples,
    check_bare_prompt,
    check_fit,
    check_save_load,
    check_checkpoint,
)


def run_check(
    cls: type[Localizer] | str,
    check: Callable[..., None],
    *,
    model: Model | None = None,
    params: dict[str, Any] | None = None,
    facts: list | None = None,
) -> None:
    """Run one ``check`` of :data:`CHECKS` on ``cls`` (a class or a registered name) in a temporary
    folder, with the arguments :func:`check_localizer` documents; a failure is a
    :class:`~capinterp.testing.contract.ContractError` naming the class and the check."""
    cls = get(cls) if isinstance(cls, str) else cls
    model = default_model() if model is None else model
    facts = check_facts(model) if facts is None else facts
    with tempfile.TemporaryDirectory() as d:
        try:
            check(cls, model, facts, contract_params(cls, params), Path(d))
        except AssertionError as err:
            raise ContractError(f"{cls.__name__}: {check.__name__}: {err}") from err


def check_localizer(
    cls: type[Localizer] | str,
    *,
    model: Model | None = None,
    params: dict[str, Any] | None = None,
    facts: list | None = None,
) -> None:
    """Check a localizer class (or a registered name) against the contract: every check of
    :data:`CHECKS` in turn; the first failure is a :class:`~capinterp.testing.contract.ContractError`
    (an AssertionError) naming the check.

    Args:
        cls: the class, or its registry name.
        model: the model to fit on (default: :func:`default_model`, the tiny model).
        params: hyper-parameters to construct it with, over those of :func:`contract_params`.
        facts: what to fit on (default: :func:`check_facts` of the model).
    """
    model = default_model() if model is None else model
    facts = check_facts(model) if facts is None else facts
    for check in CHECKS:
        run_check(cls, check, model=model, params=params, facts=facts)
