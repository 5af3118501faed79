"""The ``Localizer`` base class, its declared capabilities, and the registry of localizers by name.

Conventions (scikit-learn's estimator style): the constructor takes the model and
hyper-parameters only and validates them at once; ``fit(data)`` does the work and returns
``self``; learned results end in an underscore (``scores_``, ``neurons_``, ``units_``, ``meta_``).
Every localizer accepts ``batch_size``, ``device`` (moves the model there) and ``progress``.

What a localizer can do is declared as class attributes (:attr:`Localizer.unit_kind`,
:attr:`Localizer.scope`, :attr:`Localizer.per_query`, :attr:`Localizer.checkpointable`); the
CLI, :class:`~capinterp.localizers.query_localization.QueryLocalization` and the experiments
read them instead of testing class names, so a new method only touches its own file and its
docs page (docs/extending.md).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, ClassVar, TypeVar

from capinterp.core import validate
from capinterp.core.model import model_meta, move_model

_REGISTRY: dict[str, type[Localizer]] = {}
_ALIASES: dict[str, str] = {}
L = TypeVar("L", bound=type["Localizer"])

#: Values of :attr:`Localizer.unit_kind`: FFN neurons, whole layers, or circuit edges.
UNIT_KINDS: tuple[str, ...] = ("neuron", "layer", "edge")
#: Values of :attr:`Localizer.scope`: one result for a whole dataset, or per fact (a bag of prompts).
SCOPES: tuple[str, ...] = ("dataset", "fact")
#: Constructor arguments that change how a fit runs, not what it computes (left out of ``meta_["params"]``).
RUNTIME_PARAMS: tuple[str, ...] = ("batch_size", "checkpoint", "device", "progress")


def register(name: str, *, aliases: tuple[str, ...] = ()) -> Callable[[L], L]:
    """Class decorator: make a localizer available as ``capinterp.localizers.get(name)``.

    ``aliases`` are older names that still resolve to the class but are not listed by
    :func:`available`. The class's declared capabilities are checked here, at import time.
    """

    def deco(cls: L) -> L:
        key = name.lower()
        for k in (key, *map(str.lower, aliases)):
            owner = _REGISTRY.get(k) or _REGISTRY.get(_ALIASES.get(k, ""))
            if owner is not None and owner is not cls:
                raise ValueError(f"a localizer named {k!r} is already registered")
        if cls.unit_kind not in UNIT_KINDS:
            raise ValueError(f"{cls.__name__}.unit_kind must be one of {UNIT_KINDS}, got {cls.unit_kind!r}")
        if cls.scope not in SCOPES:
            raise ValueError(f"{cls.__name__}.scope must be one of {SCOPES}, got {cls.scope!r}")
        cls.name = key
        _REGISTRY[key] = cls
        _ALIASES.update({a.lower(): key for a in aliases})
        return cls

    return deco


def get(name: str) -> type[Localizer]:
    """The localizer class registered under ``name`` or one of its aliases (case-insensitive)."""
    try:
        key = name.lower()
        return _REGISTRY[_ALIASES.get(key, key)]
    except (KeyError, AttributeError):
        raise ValueError(f"unknown localizer {name!r}; available: {', '.join(available())}") from None


def available(**capabilities: Any) -> list[str]:
    """Registered localizer names, sorted; keyword filters keep those whose class attributes match.

    >>> available(unit_kind="neuron", scope="dataset")   # ['cnl', 'dcsn']
    """
    bad = [k for k in capabilities if k not in Localizer.CAPABILITIES]
    if bad:
        raise ValueError(f"unknown capability {bad[0]!r}; choose among {', '.join(Localizer.CAPABILITIES)}")
    return sorted(k for k, cls in _REGISTRY.items() if all(getattr(cls, c) == v for c, v in capabilities.items()))


def former_name(value: Any, old: Any, name: str, old_name: str, default: Any) -> Any:
    """``value``, or ``old`` when a caller used the argument's former name ``old_name``."""
    if old is None:
        return value
    if value != default and value != old:
        raise ValueError(
            f"pass {name}= only ({old_name}= is its former name), got {name}={value!r}, {old_name}={old!r}"
        )
    return old


class Localizer:
    """Base class: hyper-parameters in ``__init__``, ``fit(data)`` returns ``self``, results end in ``_``.

    Subclasses declare what they do with the class attributes below and call
    :meth:`_set_meta` at the end of ``fit``, so every localizer records its metadata the same way:
    ``meta_ = {"method": name, "params": hyper-parameters, model fields, ...extra}``.
    """

    #: Registry name, set by :func:`register`.
    name: ClassVar[str] = "localizer"
    #: What ``units_`` holds: ``"neuron"`` (a NeuronSet), ``"layer"`` or ``"edge"`` (a KeySet).
    unit_kind: ClassVar[str] = "neuron"
    #: ``"dataset"``: one result for all examples passed to ``fit``; ``"fact"``: the examples are
    #: paraphrases of one fact (KN's bags, causal tracing's facts).
    scope: ClassVar[str] = "dataset"
    #: True when ``fit`` also leaves per-prompt neuron scores ``prompt_scores_`` ``[n, n_layers, d_mlp]``
    #: (what :class:`~capinterp.localizers.query_localization.QueryLocalization` needs).
    per_query: ClassVar[bool] = False
    #: True when the constructor takes ``checkpoint=path`` and ``fit`` resumes from it.
    checkpointable: ClassVar[bool] = False
    #: The capability attributes, in the order the docs list them.
    CAPABILITIES: ClassVar[tuple[str, ...]] = ("unit_kind", "scope", "per_query", "checkpointable")

    def __init__(self, model: Any, *, batch_size: int = 32, device: Any = None, progress: bool = True) -> None:
        validate.model(model)
        batch_size = validate.positive_int("batch_size", batch_size)
        move_model(model, device)  # checked first: a bad device leaves the model untouched
        self.model = model
        self.batch_size = int(batch_size)
        self.progress = bool(progress)

    def fit(self, data: Any) -> Localizer:  # pragma: no cover - abstract
        """Localize on ``data`` (examples, or prompts of one fact) and return ``self``."""
        raise NotImplementedError

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
        """Build ``self.meta_`` (the one metadata dict every result of this fit records) and return it."""
        self.meta_ = {"method": self.name, "params": self.hyper_params(), **model_meta(self.model), **extra}
        return self.meta_

    def _check_fitted(self, attr: str = "units_") -> None:
        if not hasattr(self, attr):
            raise RuntimeError(f"{type(self).__name__} is not fitted yet: call .fit(data) first")

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_params().items())
        return f"{type(self).__name__}({args})"
