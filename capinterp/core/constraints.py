"""Declared hyper-parameter constraints, checked before a constructor runs (scikit-learn's
``_parameter_constraints`` is the model).

A class declares, per constructor keyword, the list of constraints a value may meet (any one
is enough)::

    _parameter_constraints = {
        "steps": [Interval(int, 1, None)],
        "rule": [Options("right", "gauss")],
        "batch_size": [Interval(int, 1, None), "auto"],   # a bare string: that literal value
        "completeness_tol": [Interval(float, 0, None, closed="neither"), None],
        "baseline": [NO_VALIDATION],                      # checked by hand (a shape)
    }

:func:`parameter_constraints` merges the dicts over the class hierarchy (a subclass's entry
replaces its parent's); :func:`validates_params` wraps a constructor so every declared keyword
is checked (:func:`check_params`) before its body runs. :class:`capinterp.localizers.Localizer`
applies it to every subclass's ``__init__``. The messages are :mod:`capinterp.core.validate`'s:
they name the argument, the value given and what is allowed. :func:`invalid_values` builds, per
constraint, values that break it (out of the interval, of the wrong type, not an option): the
contract check (:func:`capinterp.testing.localizer_checks.check_bad_params`) passes each one.
Checks that need two values (``min_neurons <= max_neurons``) stay in the constructor.
"""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, TypeVar, cast

from capinterp.core import validate
from capinterp.core.validate import _bounds, _show

__all__ = [
    "NO_VALIDATION",
    "PATH",
    "Boolean",
    "Constraint",
    "Custom",
    "Device",
    "InstanceOf",
    "Interval",
    "IsCallable",
    "IsNone",
    "Options",
    "Subset",
    "Texts",
    "check_params",
    "check_value",
    "constructor_parameters",
    "constructor_signature_parameters",
    "invalid_values",
    "parameter_constraints",
    "validates_params",
]

#: Declares a parameter without checking it (the constructor checks it by hand).
NO_VALIDATION = "no_validation"
_SHOWN_INVALID = "__invalid__"
_F = TypeVar("_F", bound=Callable[..., None])


class Constraint:
    """One allowed form of a value: :meth:`check` returns it cleaned or raises a ValueError /
    TypeError naming the argument; :meth:`describe` says what is allowed (for a message joining
    several forms); :meth:`invalid` gives values that break it."""

    def check(self, name: str, value: Any) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    def describe(self) -> str:  # pragma: no cover - abstract
        raise NotImplementedError

    def invalid(self) -> list[Any]:
        return []

    def satisfied_by(self, value: Any) -> bool:
        try:
            self.check("value", value)
        except (TypeError, ValueError):
            return False
        return True

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.describe()})"


class Interval(Constraint):
    """An int (``kind=int``, bools and floats refused) or a finite real (``kind=float``, ints and
    0-d tensors accepted) within ``[low, high]``; ``closed`` is ``"both"``, ``"left"``, ``"right"``
    or ``"neither"`` (which bounds belong to the interval); None: no bound."""

    def __init__(self, kind: type, low: float | None, high: float | None, *, closed: str = "both") -> None:
        if kind not in (int, float):
            raise TypeError(f"Interval kind must be int or float, got {kind!r}")
        if closed not in ("both", "left", "right", "neither"):
            raise ValueError(f"closed must be 'both', 'left', 'right' or 'neither', got {closed!r}")
        self.kind, self.low, self.high = kind, low, high
        self.low_open = closed in ("right", "neither")
        self.high_open = closed in ("left", "neither")

    def _int_bounds(self) -> tuple[int | None, int | None]:
        low = None if self.low is None else int(self.low) + (1 if self.low_open else 0)
        high = None if self.high is None else int(self.high) - (1 if self.high_open else 0)
        return low, high

    def check(self, name: str, value: Any) -> Any:
        if self.kind is int:
            low, high = self._int_bounds()
            return validate.integer(name, value, low=low, high=high)
        return validate.finite_float(
            name, value, low=self.low, high=self.high, low_open=self.low_open, high_open=self.high_open
        )

    def describe(self) -> str:
        if self.kind is int:
            return f"an integer {_bounds(*self._int_bounds())}".rstrip()
        return f"a finite number {_bounds(self.low, self.high, self.low_open, self.high_open)}".rstrip()

    def invalid(self) -> list[Any]:
        if self.kind is int:
            low, high = self._int_bounds()
            out: list[Any] = [2.5, "1"]
            out += [] if low is None else [low - 1]
            return out + ([] if high is None else [high + 1])
        out = [float("nan"), "1"]
        if self.low is not None:
            out.append(float(self.low) if self.low_open else float(self.low) - 1.0)
        if self.high is not None:
            out.append(float(self.high) if self.high_open else float(self.high) + 1.0)
        return out


class Options(Constraint):
    """One of the given values (compared with ``==``)."""

    def __init__(self, *options: Any) -> None:
        if not options:
            raise ValueError("Options needs at least one value")
        self.options = tuple(options)

    def check(self, name: str, value: Any) -> Any:
        try:  # a str equals only a str option: no 1 == True == 1.0 confusion across types
            ok = any(isinstance(value, str) == isinstance(o, str) and bool(value == o) for o in self.options)
        except (TypeError, ValueError, RuntimeError):  # a value whose == is not one bool (an array)
            ok = False
        if not ok:
            allowed = ", ".join(map(str, self.options))
            raise ValueError(f"unknown {name} {_show(value)}: {name} must be one of {allowed}")
        return value

    def describe(self) -> str:
        if len(self.options) == 1:
            return repr(self.options[0])
        return f"one of {', '.join(map(repr, self.options))}"

    def invalid(self) -> list[Any]:
        return [_SHOWN_INVALID]


class Boolean(Constraint):
    """True or False (numpy's bool too); ``0``, ``1`` or ``"yes"`` are refused."""

    def check(self, name: str, value: Any) -> Any:
        return validate.boolean(name, value)

    def describe(self) -> str:
        return "True or False"

    def invalid(self) -> list[Any]:
        return ["yes"]


class IsNone(Constraint):
    """The value None."""

    def check(self, name: str, value: Any) -> Any:
        if value is not None:
            raise TypeError(f"{name} must be None, got {_show(value)}")
        return value

    def describe(self) -> str:
        return "None"


class InstanceOf(Constraint):
    """An instance of ``types``; ``what`` names them in messages (default: the type names)."""

    def __init__(self, types: type | tuple[type, ...], what: str | None = None) -> None:
        self.types = types if isinstance(types, tuple) else (types,)
        self.what = what or " or ".join(t.__name__ for t in self.types)

    def check(self, name: str, value: Any) -> Any:
        if not isinstance(value, self.types):
            raise TypeError(f"{name} must be {self.what}, got {_show(value)} ({type(value).__name__})")
        return value

    def describe(self) -> str:
        return self.what

    def invalid(self) -> list[Any]:
        return [3.5, object()]


#: A file-system path: a str or an ``os.PathLike``.
PATH = InstanceOf((str, os.PathLike), "a path (str or Path)")


class IsCallable(Constraint):
    """Anything callable (a function, a class, an object with ``__call__``)."""

    def check(self, name: str, value: Any) -> Any:
        if not callable(value):
            raise TypeError(f"{name} must be a callable, got {_show(value)} ({type(value).__name__})")
        return value

    def describe(self) -> str:
        return "a callable"

    def invalid(self) -> list[Any]:
        return [3.5]


class Device(Constraint):
    """A device spec torch understands and this machine has, or None (the default device):
    :func:`capinterp.core.validate.device`."""

    def check(self, name: str, value: Any) -> Any:
        return validate.device(name, value)

    def describe(self) -> str:
        return "a device ('cpu', 'cuda', 'cuda:1', 'mps', a torch.device) or None"

    def invalid(self) -> list[Any]:
        return ["no-such-device", 3.5]


class Texts(Constraint):
    """An iterable of strings (a list, a tuple), not one string; its items are not read here (a
    generator stays unconsumed)."""

    def check(self, name: str, value: Any) -> Any:
        if isinstance(value, (str, bytes)):
            raise ValueError(f"{name} must be a list of strings, not one string")
        if not isinstance(value, Iterable):
            raise TypeError(f"{name} must be a list of strings, got {_show(value)} ({type(value).__name__})")
        return value

    def describe(self) -> str:
        return "a list of strings"

    def invalid(self) -> list[Any]:
        return ["one string", 3.5]


class Subset(Constraint):
    """Distinct values among ``options``, at least one, as a tuple (one string is a subset of one).
    An iterator (a generator) is returned unchecked: reading it would consume it; check the tuple
    the constructor makes of it with :meth:`check` again."""

    def __init__(self, *options: Any) -> None:
        self.options = tuple(options)

    def check(self, name: str, value: Any) -> Any:
        if isinstance(value, Iterator):
            return value
        items = (value,) if isinstance(value, str) else tuple(value) if isinstance(value, Iterable) else None
        if not items or any(v not in self.options for v in items) or len(set(items)) != len(items):
            raise ValueError(f"{name} must be distinct values among {self.options}, got {_show(value)}")
        return items

    def describe(self) -> str:
        return f"distinct values among {self.options}"

    def invalid(self) -> list[Any]:
        return [(), (_SHOWN_INVALID,), (self.options[0], self.options[0])]


class Custom(Constraint):
    """A check by a function ``fn(value)`` that raises a ValueError / TypeError naming the argument
    (e.g. a parser); ``what`` describes the allowed values, ``bad`` lists values it refuses."""

    def __init__(self, fn: Callable[[Any], Any], what: str, bad: Iterable[Any] = ()) -> None:
        self.fn, self.what, self.bad = fn, what, list(bad)

    def check(self, name: str, value: Any) -> Any:
        return self.fn(value)

    def describe(self) -> str:
        return self.what

    def invalid(self) -> list[Any]:
        return list(self.bad)


def _as_constraint(item: Any) -> Constraint:
    if isinstance(item, Constraint):
        return item
    if item is None:
        return IsNone()
    if isinstance(item, str):
        return Options(item)
    if isinstance(item, type):
        return InstanceOf(item)
    raise TypeError(f"not a constraint: {item!r} (a Constraint, None, a literal string or a type)")


def _constraints(spec: Any) -> list[Constraint] | None:
    """The spec's constraints; None for :data:`NO_VALIDATION`."""
    items = list(spec) if isinstance(spec, (list, tuple)) else [spec]
    if any(isinstance(i, str) and i == NO_VALIDATION for i in items):
        return None
    return [_as_constraint(i) for i in items]


def check_value(name: str, value: Any, spec: Any) -> Any:
    """``value`` cleaned by the first constraint of ``spec`` it meets; otherwise that constraint's
    error when ``spec`` holds one, else one ValueError (TypeError when every constraint raised one)
    naming every allowed form."""
    cons = _constraints(spec)
    if cons is None:
        return value
    errors: list[Exception] = []
    for c in cons:
        try:
            return c.check(name, value)
        except (TypeError, ValueError) as err:
            errors.append(err)
    if len(errors) == 1:
        raise errors[0]
    err_type = TypeError if all(isinstance(e, TypeError) for e in errors) else ValueError
    raise err_type(f"{name} must be {', or '.join(c.describe() for c in cons)}, got {_show(value)}")


def check_params(constraints: Mapping[str, Any], values: Mapping[str, Any]) -> dict[str, Any]:
    """Every value whose name ``constraints`` declares, checked (:func:`check_value`); the cleaned
    values (undeclared names pass unchanged)."""
    return {k: (check_value(k, v, constraints[k]) if k in constraints else v) for k, v in values.items()}


def parameter_constraints(cls: type) -> dict[str, Any]:
    """The ``_parameter_constraints`` of ``cls`` merged over its hierarchy (the subclass's entry wins)."""
    out: dict[str, Any] = {}
    for klass in reversed(cls.__mro__):
        out.update(vars(klass).get("_parameter_constraints", {}))
    return out


def constructor_signature_parameters(cls: type) -> dict[str, inspect.Parameter]:
    """The keyword parameters ``cls(...)`` takes, by name, over the constructors of its hierarchy
    (a constructor's ``**kwargs`` passed on to its parent's; the first declaration of a name wins);
    the model and ``self`` excluded."""
    params: dict[str, inspect.Parameter] = {}
    for klass in cls.__mro__:
        init = vars(klass).get("__init__")
        if init is None or klass is object:
            continue
        for p in inspect.signature(init).parameters.values():
            if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name not in ("self", "model", *params):
                params[p.name] = p
    return params


def constructor_parameters(cls: type) -> list[str]:
    """The names of :func:`constructor_signature_parameters`, in that order."""
    return list(constructor_signature_parameters(cls))


def invalid_values(spec: Any) -> list[Any]:
    """Values that break ``spec``: each constraint's own bad values that no other one accepts."""
    cons = _constraints(spec) or []
    return [v for c in cons for v in c.invalid() if not any(o.satisfied_by(v) for o in cons)]


def validates_params(init: _F) -> _F:
    """Wrap a constructor: the keyword arguments its class declares (:func:`parameter_constraints`
    of ``type(self)``) are checked before the body runs, defaults and ``**kwargs`` included."""
    if getattr(init, "_validates_params", False):
        return init
    sig = inspect.signature(init)

    @functools.wraps(init)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> None:
        try:
            bound = sig.bind(self, *args, **kwargs)
        except TypeError:
            unknown = [k for k in kwargs if k not in sig.parameters]
            if unknown and not any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values()):
                takes = ", ".join(constructor_parameters(type(self)))
                raise TypeError(
                    f"{type(self).__name__}() got an unexpected keyword argument {unknown[0]!r}; it takes: {takes}"
                ) from None
            return init(self, *args, **kwargs)  # Python's own error for a call that does not bind
        bound.apply_defaults()
        values: dict[str, Any] = {}
        for name, value in list(bound.arguments.items())[1:]:
            if sig.parameters[name].kind is inspect.Parameter.VAR_KEYWORD:
                values.update(value)
            elif sig.parameters[name].kind is not inspect.Parameter.VAR_POSITIONAL:
                values[name] = value
        values.pop("model", None)
        check_params(parameter_constraints(type(self)), values)
        return init(self, *args, **kwargs)

    wrapper._validates_params = True  # type: ignore[attr-defined]
    return cast(_F, wrapper)
