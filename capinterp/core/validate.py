"""One validation layer for every public entry point: checks that run before any model work.

Each check returns the cleaned value or raises a ``ValueError`` / ``TypeError`` whose message
names the argument, the value given and what is allowed, e.g.
``ValueError: sigma must be a finite number > 0, got inf``. Booleans are never accepted as
numbers (``steps=True`` is refused), and integral floats are not accepted as integers
(``batch_size=2.5`` and ``batch_size=2.0`` are refused alike), so a typo never turns into a
silently different run.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Collection
from typing import Any

from capinterp.core.example import Example, as_examples
from capinterp.core.settings import resolve_device

__all__ = [
    "boolean",
    "choice",
    "examples",
    "finite_float",
    "integer",
    "nonneg_int",
    "positive_int",
    "probability",
]


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _bounds(low: float | None, high: float | None, low_open: bool = False, high_open: bool = False) -> str:
    if low is not None and high is not None:
        return f"in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
    if low is not None:
        return f"{'>' if low_open else '>='} {low:g}"
    return f"{'<' if high_open else '<='} {high:g}" if high is not None else ""


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Number) or (hasattr(value, "item") and getattr(value, "ndim", 1) == 0)


def integer(name: str, value: Any, *, low: int | None = None, high: int | None = None) -> int:
    """``value`` as an int in ``[low, high]`` (either bound optional).

    A bool, a float (even ``2.0``) or a string is a ValueError; any other non-number (None, a
    list) a TypeError.
    """
    what = f"an integer {_bounds(low, high)}".rstrip()
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        err = ValueError if _is_number(value) or isinstance(value, str) else TypeError
        raise err(f"{name} must be {what}, got {_show(value)} ({type(value).__name__})")
    v = int(value)
    if (low is not None and v < low) or (high is not None and v > high):
        raise ValueError(f"{name} must be {what}, got {v}")
    return v


def positive_int(name: str, value: Any) -> int:
    """An int >= 1 (batch sizes, steps, sample counts)."""
    return integer(name, value, low=1)


def nonneg_int(name: str, value: Any) -> int:
    """An int >= 0 (seeds, counts that may be zero)."""
    return integer(name, value, low=0)


def finite_float(
    name: str,
    value: Any,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
) -> float:
    """``value`` as a finite float within the bounds (closed unless ``low_open`` / ``high_open``).

    Ints and 0-d numpy / torch values are accepted; NaN, +-inf, bools and strings are
    ValueErrors, other non-numbers (None, lists) TypeErrors.
    """
    bounds = _bounds(low, high, low_open, high_open)
    what = f"{bounds} (a finite number)" if bounds else "a finite number"
    if isinstance(value, bool) or not _is_number(value):
        err = ValueError if isinstance(value, (bool, str)) else TypeError
        raise err(f"{name} must be {what}, got {_show(value)} ({type(value).__name__})")
    if not isinstance(value, numbers.Real):
        value = value.item()
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError(f"{name} must be {what}, got {_show(value)} ({type(value).__name__})")
    v = float(value)
    bad_low = low is not None and (v <= low if low_open else v < low)
    bad_high = high is not None and (v >= high if high_open else v > high)
    if not math.isfinite(v) or bad_low or bad_high:
        raise ValueError(f"{name} must be {what}, got {v!r}")
    return v


def probability(name: str, value: Any, *, high_open: bool = False) -> float:
    """A finite float in [0, 1] (or [0, 1) with ``high_open``)."""
    return finite_float(name, value, low=0.0, high=1.0, high_open=high_open)


def boolean(name: str, value: Any) -> bool:
    """A real bool (also numpy's); ``0`` / ``1`` / ``"yes"`` are refused."""
    if type(value).__name__ == "bool_":  # numpy.bool_
        return bool(value)
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {_show(value)} ({type(value).__name__})")
    return value


def choice(name: str, value: Any, allowed: Collection[Any]) -> Any:
    """``value`` if it is one of ``allowed`` (compared with ==, unhashable values refused)."""
    try:
        ok = value in allowed
    except TypeError:
        ok = False
    if not ok:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, allowed))}; got {_show(value)}")
    return value


def examples(data: Any, name: str = "data", *, min_count: int = 1, need_target: bool = False) -> list[Example]:
    """A dataset as ``list[Example]`` (see :func:`capinterp.core.example.as_examples` for the forms).

    Refuses a bare string / bytes / single Example, fewer than ``min_count`` examples, empty
    prompts, and with ``need_target`` empty targets; every message names the example's index.
    """
    try:
        out = as_examples(data)
    except (TypeError, ValueError) as err:
        raise type(err)(f"{name}: {err}") from None
    if len(out) < min_count:
        raise ValueError(
            f"{name} is an empty dataset: it must hold at least {min_count} example(s), got {len(out)}"
            if not out
            else f"{name} must hold at least {min_count} examples, got {len(out)}"
        )
    if need_target:
        empty = [i for i, e in enumerate(out) if not e.target]
        if empty:
            raise ValueError(
                f"{name}: example {empty[0]} ({out[empty[0]].prompt!r:.60}) has an empty target; "
                "this method needs the answer text"
            )
    return out


def device(name: str, value: Any) -> Any:
    """A device spec torch understands and this machine has (``None`` passes: the default).

    The check is :func:`capinterp.core.settings.resolve_device`'s (also used before every model
    move); its TypeError / ValueError is re-raised naming ``name`` (e.g. ``--device``), before any
    model is loaded or moved.
    """
    if value is None:
        return None
    try:
        resolve_device(value)
    except (TypeError, ValueError) as err:
        raise type(err)(f"{name}: {err}") from None
    return value


def model(value: Any, name: str = "model") -> Any:
    """A loaded model (a ``TransformerBridge`` from :func:`capinterp.arch.model.load_model`):
    anything without ``cfg.n_layers`` / ``cfg.d_mlp`` and hooks is a TypeError naming what it got."""
    cfg = getattr(value, "cfg", None)
    if cfg is None or not hasattr(cfg, "n_layers") or not hasattr(cfg, "d_mlp") or not hasattr(value, "hooks"):
        raise TypeError(
            f"{name} must be a model from capinterp.load_model(...) (a TransformerBridge), "
            f"got {_show(value)} ({type(value).__name__})"
        )
    return value
