"""The ``Localizer`` base class, its declared capabilities, and the registry of localizers by name.

Conventions (scikit-learn's estimator style): the constructor takes the model and
hyper-parameters only and validates them at once; ``fit(data)`` does the work and returns
``self``; learned results end in an underscore (``scores_``, ``neurons_``, ``units_``, ``meta_``).
Every localizer accepts ``batch_size``, ``device`` (``fit`` moves the model there) and ``progress``;
the constructor never reads, runs or moves the model: ``fit`` starts with ``_begin_fit()``.

What a localizer can do is declared as class attributes (:attr:`Localizer.unit_kind`,
:attr:`Localizer.scope`, :attr:`Localizer.per_query`, :attr:`Localizer.checkpointable`,
:attr:`Localizer.fills_greedy`); the
CLI, :class:`~capinterp.localizers.query_localization.QueryLocalization` and the experiments
read them instead of testing class names, so a new method only touches its own file and its
docs page (docs/extending.md).
"""

from __future__ import annotations

import importlib.metadata
import inspect
import warnings
from collections.abc import Callable
from typing import Any, ClassVar, TypeVar, cast

from capinterp.arch.model import model_meta, move_model
from capinterp.core import validate
from capinterp.core.constraints import Boolean, Device, Interval, constructor_signature_parameters, validates_params
from capinterp.core.protocol import Model
from capinterp.units.base import KeySet

__all__ = [
    "CAPABILITY_VALUES",
    "ENTRY_POINT_GROUP",
    "RUNTIME_PARAMS",
    "SCOPES",
    "UNIT_KINDS",
    "Localizer",
    "available",
    "get",
    "register",
]

_REGISTRY: dict[str, type[Localizer]] = {}
L = TypeVar("L", bound=type["Localizer"])

#: The entry-point group through which another installed package adds localizers: in its
#: ``pyproject.toml``, ``[project.entry-points."capinterp.localizers"]`` ``mine = "pkg.module:MyLocalizer"``.
#: They are loaded on the first :func:`get` / :func:`available`, not at import.
ENTRY_POINT_GROUP = "capinterp.localizers"
_entry_points_loaded = False

#: Values of :attr:`Localizer.unit_kind`: FFN neurons, whole layers, circuit edges, or MoE experts.
UNIT_KINDS: tuple[str, ...] = ("neuron", "layer", "edge", "expert")
#: Values of :attr:`Localizer.scope`: one result for a whole dataset, or per fact (a bag of prompts).
SCOPES: tuple[str, ...] = ("dataset", "fact")
#: The values each capability attribute may take (checked by :func:`register`).
CAPABILITY_VALUES: dict[str, tuple[Any, ...]] = {
    "unit_kind": UNIT_KINDS,
    "scope": SCOPES,
    "per_query": (True, False),
    "checkpointable": (True, False),
    "fills_greedy": (True, False),
}
#: Constructor arguments that change how a fit runs, not what it computes (left out of ``meta_["params"]``).
RUNTIME_PARAMS: tuple[str, ...] = ("batch_size", "checkpoint", "device", "progress")


def register(name: str) -> Callable[[L], L]:
    """Class decorator: make a localizer available as ``capinterp.localizers.get(name)``.

    The name is lower-cased; the class's declared capabilities are checked here, at import time.
    A second class under a taken name is refused.
    """

    def deco(cls: L) -> L:
        key = name.lower()
        owner = _REGISTRY.get(key)
        if owner is not None and owner is not cls:
            raise ValueError(f"a localizer named {key!r} is already registered ({owner.__module__}.{owner.__name__})")
        if not (isinstance(cls, type) and issubclass(cls, Localizer)):
            raise TypeError(f"register({name!r}) needs a Localizer subclass, got {cls!r}")
        for cap, values in CAPABILITY_VALUES.items():
            value = getattr(cls, cap)
            if not any(value is v or (isinstance(v, str) and value == v) for v in values):
                raise ValueError(f"{cls.__name__}.{cap} must be one of {values}, got {value!r}")
        cls.name = key
        _REGISTRY[key] = cls
        return cls

    return deco


def _load_entry_points() -> None:
    """Import the localizers other packages declare in :data:`ENTRY_POINT_GROUP` (once).

    An entry point names a Localizer subclass; importing its module usually registers it (the
    ``@register`` decorator), otherwise it is registered under the entry point's name. One that
    fails to load is skipped with a warning naming it, so a broken plugin cannot hide the others.
    """
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True  # first: a plugin that imports capinterp.localizers must not recurse
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            cls = ep.load()
            if cls not in _REGISTRY.values():
                register(ep.name)(cls)
        except Exception as err:
            warnings.warn(
                f"localizer entry point {ep.name!r} ({ep.value}) was not loaded: {type(err).__name__}: {err}",
                RuntimeWarning,
                stacklevel=3,
            )


def get(name: str) -> type[Localizer]:
    """The localizer class registered under ``name`` (case-insensitive), entry points included."""
    _load_entry_points()
    try:
        return _REGISTRY[name.lower()]
    except (KeyError, AttributeError):
        raise ValueError(f"unknown localizer {name!r}; available: {', '.join(available())}") from None


def available(**capabilities: Any) -> list[str]:
    """Registered localizer names (entry points included), sorted; keyword filters keep those whose
    class attributes match.

    >>> available(unit_kind="neuron", scope="dataset")   # ['cnl', 'dcsn', 'neft']
    """
    _load_entry_points()
    bad = [k for k in capabilities if k not in Localizer.CAPABILITIES]
    if bad:
        raise ValueError(f"unknown capability {bad[0]!r}; choose among {', '.join(Localizer.CAPABILITIES)}")
    return sorted(k for k, cls in _REGISTRY.items() if all(getattr(cls, c) == v for c, v in capabilities.items()))


def _merged_signature(cls: type) -> inspect.Signature:
    """``cls(model, *, ...)`` with every keyword its constructors take, a subclass's ``**kwargs``
    passed on to its parents' (so ``inspect.signature(KN)`` shows ``steps``, ``rule``, ``device``, ...)."""
    params = constructor_signature_parameters(cls).values()
    model = inspect.Parameter("model", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation="Model")
    return inspect.Signature([model, *(p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in params)])


class Localizer:
    """Base class: hyper-parameters in ``__init__``, ``fit(data)`` returns ``self``, results end in ``_``.

    Subclasses declare what they do with the class attributes below and call
    :meth:`_set_meta` at the end of ``fit``, so every localizer records its metadata the same way:
    ``meta_ = {"method": name, "params": hyper-parameters, model fields, ...extra}``.
    """

    #: Registry name, set by :func:`register`.
    name: ClassVar[str] = "localizer"
    #: What ``units_`` holds: ``"neuron"`` (a NeuronSet), ``"layer"``, ``"edge"`` or ``"expert"`` (a KeySet).
    unit_kind: ClassVar[str] = "neuron"
    #: ``"dataset"``: one result for all examples passed to ``fit``; ``"fact"``: the examples are
    #: paraphrases of one fact (KN's bags, causal tracing's facts).
    scope: ClassVar[str] = "dataset"
    #: True when ``fit`` also leaves per-prompt neuron scores ``prompt_scores_`` ``[n, n_layers, d_mlp]``
    #: (what :class:`~capinterp.localizers.query_localization.QueryLocalization` needs).
    per_query: ClassVar[bool] = False
    #: True when the constructor takes ``checkpoint=path`` and ``fit`` resumes from it.
    checkpointable: ClassVar[bool] = False
    #: True when ``fit`` takes a bare prompt (no target) and fills its target with the model's greedy
    #: next token (``meta["target_from"] = "greedy"``); False: ``fit`` refuses a bare prompt with the
    #: TokenizationError ("empty target") every entry point that needs the answer raises, before any
    #: forward pass (checked by :func:`capinterp.testing.data_checks.check_bare_prompt`).
    fills_greedy: ClassVar[bool] = False
    #: The capability attributes, in the order the docs list them.
    CAPABILITIES: ClassVar[tuple[str, ...]] = tuple(CAPABILITY_VALUES)
    #: Hyper-parameters that keep :func:`capinterp.testing.check_localizer`'s run small and
    #: self-contained (e.g. AMIG's baseline texts); never used otherwise. The public hook of the
    #: contract: :func:`capinterp.testing.contract_params` builds every check's arguments from it.
    check_params: ClassVar[dict[str, Any]] = {}

    #: The constraints on each constructor keyword (:mod:`capinterp.core.constraints`; scikit-learn's
    #: ``_parameter_constraints``): merged over the class hierarchy, a subclass's entry replacing
    #: its parent's, and checked before every constructor's body runs (:meth:`__init_subclass__`).
    #: Set by :func:`capinterp.interventions.certify.certify` on the localizer it certifies.
    certificate_: Any

    _parameter_constraints: ClassVar[dict[str, list[Any]]] = {
        "batch_size": [Interval(int, 1, None)],
        "device": [Device()],
        "progress": [Boolean()],
    }

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Every subclass's ``__init__`` checks the declared hyper-parameters before its body runs
        (:func:`capinterp.core.constraints.validates_params`): a bad value is a ValueError / TypeError
        naming it, before anything is stored or the model is looked at."""
        super().__init_subclass__(**kwargs)
        if not getattr(cls.__init__, "_validates_params", False):  # its own, or a mixin's, unchecked
            cls.__init__ = validates_params(cls.__init__)  # type: ignore[method-assign]
        cls.__signature__ = _merged_signature(cls)  # type: ignore[attr-defined]  # help() / IDEs see every keyword

    @validates_params
    def __init__(self, model: Model, *, batch_size: int = 32, device: Any = None, progress: bool = True) -> None:
        # Store hyper-parameters only (checked by validates_params): nothing here reads, runs or moves
        # the model (scikit-learn's convention), so constructing never fails on the model; ``fit`` does that work.
        self.model = model
        self.batch_size = int(batch_size)
        self.device = device
        self.progress = bool(progress)

    def fit(self, data: Any) -> Localizer:  # pragma: no cover - abstract
        """Localize on ``data`` (examples, or prompts of one fact) and return ``self``.

        Implementations call ``_begin_fit()`` first (before touching the model)."""
        raise NotImplementedError

    def estimate(self, data: Any) -> Any:
        """Predicted wall seconds and peak memory of ``fit(data)`` on this machine, before any work:
        ``data`` is checked as ``fit`` checks it, the passes are counted, and a short probe times the
        model (:mod:`capinterp.localizers.cost`; an :class:`~capinterp.localizers.cost.Estimate`)."""
        from capinterp.localizers.cost import estimate

        return estimate(self, data)

    def _cost(self, data: Any) -> Any:  # pragma: no cover - abstract
        """The :class:`~capinterp.localizers.cost.Work` ``fit(data)`` will do, counted without running
        the model (``data`` validated as ``fit`` validates it)."""
        raise NotImplementedError(f"{type(self).__name__} does not count its cost (estimate)")

    def _begin_fit(self) -> None:
        """The model work a constructor must not do, at the start of ``fit``: check the model, move
        it to ``device``; subclasses extend it with what they derive from the model (DCSN's folded
        norms, AMIG's baseline, bounds that depend on the model's shape)."""
        validate.model(self.model)
        move_model(self.model, self.device)  # the device is checked first: a bad one leaves the model untouched

    @classmethod
    def capabilities(cls) -> dict[str, Any]:
        """The declared capabilities, e.g. ``{"unit_kind": "neuron", "scope": "dataset", ...}``."""
        return {c: getattr(cls, c) for c in cls.CAPABILITIES}

    def get_params(self) -> dict[str, Any]:
        """Hyper-parameters as given to the constructor (the model and ``progress`` excluded)."""
        params = {}
        for klass in type(self).__mro__:
            if klass is object:
                continue
            for p in inspect.signature(klass.__init__).parameters.values():  # type: ignore[misc]  # klass is a class here
                if p.name in ("self", "model") or p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL):
                    continue
                if hasattr(self, p.name) and p.name not in params:
                    v = getattr(self, p.name)
                    params[p.name] = v if isinstance(v, (int, float, str, bool, type(None), list, tuple)) else str(v)
        params.pop("progress", None)
        return params

    def hyper_params(self) -> dict[str, Any]:
        """:meth:`get_params` without the run-time arguments (:data:`RUNTIME_PARAMS`): what the result depends on."""
        return {k: v for k, v in self.get_params().items() if k not in RUNTIME_PARAMS}

    def _set_meta(self, **extra: Any) -> dict[str, Any]:
        """Build ``self.meta_`` (the one metadata dict every result of this fit records) and return it;
        a ``units_`` KeySet already set and recording nothing records it too (so it saves with the model's identity)."""
        self.meta_ = {"method": self.name, "params": self.hyper_params(), **model_meta(self.model), **extra}
        units = getattr(self, "units_", None)
        if isinstance(units, KeySet) and not units.meta:  # layers, experts: the set records the fit too
            cast(Any, self).units_ = units.with_meta(self.meta_)  # units_'s type is the subclass's
        return self.meta_

    def _check_fitted(self, attr: str = "units_") -> None:
        if not hasattr(self, attr):
            raise RuntimeError(f"{type(self).__name__} is not fitted yet: call .fit(data) first")

    def summary(self) -> str:
        """What the fit located, in a line; then the certificate's line once
        :func:`capinterp.interventions.certify.certify` has bounded what it misses (it keeps the
        certificate as ``certificate_``). IG localizers' ``summary()`` is their completeness table
        instead, with the certificate's line in its ``attrs["certificate"]``."""
        self._check_fitted()
        line = f"{type(self).__name__}: {len(cast(Any, self).units_)} {self.unit_kind}s located"
        cert = getattr(self, "certificate_", None)
        return line + "\n" + (cert.summary() if cert is not None else "not certified: see capinterp.certify")

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_params().items())
        return f"{type(self).__name__}({args})"
