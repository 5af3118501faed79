"""The ``Localizer`` base class and the registry of localizers by name.

Conventions (scikit-learn's estimator style): the constructor takes the model and
hyper-parameters only and validates them at once; ``fit(data)`` does the work and returns
``self``; learned results end in an underscore (``scores_``, ``neurons_``, ``units_``).
Every localizer accepts ``batch_size``, ``device`` (moves the model there) and ``progress``.
"""
from __future__ import annotations

import inspect
from typing import Any, Callable, ClassVar, TypeVar

_REGISTRY: dict[str, type["Localizer"]] = {}
L = TypeVar("L", bound=type["Localizer"])


def register(name: str) -> Callable[[L], L]:
    """Class decorator: make a localizer available as ``capinterp.localizers.get(name)``."""

    def deco(cls: L) -> L:
        key = name.lower()
        if key in _REGISTRY and _REGISTRY[key] is not cls:
            raise ValueError(f"a localizer named {name!r} is already registered")
        cls.name = key
        _REGISTRY[key] = cls
        return cls

    return deco


def get(name: str) -> type["Localizer"]:
    """The localizer class registered under ``name`` (case-insensitive)."""
    try:
        return _REGISTRY[name.lower()]
    except (KeyError, AttributeError):
        raise ValueError(f"unknown localizer {name!r}; available: {', '.join(available())}") from None


def available() -> list[str]:
    return sorted(_REGISTRY)


class Localizer:
    """Base class: hyper-parameters in ``__init__``, ``fit`` returns ``self``, results end in ``_``."""

    name: ClassVar[str] = "localizer"

    def __init__(self, model: Any, *, batch_size: int = 32, device: Any = None, progress: bool = True) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if device is not None:
            model.to(device, print_details=False)
        self.model = model
        self.batch_size = int(batch_size)
        self.progress = bool(progress)

    def fit(self, data: Any) -> "Localizer":  # pragma: no cover - abstract
        raise NotImplementedError

    def get_params(self) -> dict[str, Any]:
        """Hyper-parameters as given to the constructor (the model excluded): recorded in results."""
        params = {}
        for klass in type(self).__mro__:
            if klass is object:
                continue
            for p in inspect.signature(klass.__init__).parameters.values():
                if p.name in ("self", "model") or p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL):
                    continue
                if hasattr(self, p.name) and p.name not in params:
                    v = getattr(self, p.name)
                    params[p.name] = v if isinstance(v, (int, float, str, bool, type(None), list, tuple)) else str(v)
        params.pop("progress", None)
        return params

    def _check_fitted(self, attr: str = "units_") -> None:
        if not hasattr(self, attr):
            raise RuntimeError(f"{type(self).__name__} is not fitted yet: call .fit(data) first")

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_params().items())
        return f"{type(self).__name__}({args})"
