"""The data contract of ``fit``, checked on any localizer class (built-in or a plugin's).

* Bad data is refused **before any forward pass** (a pre-hook counts them), and leaves no result:
  :func:`check_bad_data` (a dataset of the wrong shape: ValueError / TypeError) and
  :func:`check_bad_examples` (bad examples: the one exception type every entry point raises for
  each, :func:`bad_examples`).
* The bare-prompt rule (:func:`check_bare_prompt`): a prompt without a target is either filled
  with the model's greedy next token, by a class that declares
  :attr:`~capinterp.localizers.base.Localizer.fills_greedy`, or refused with the TokenizationError
  ("empty target") every entry point that needs the answer raises, before any forward pass.

Each check is a function of ``(cls, model, facts, params, tmp)`` like the others of
:mod:`capinterp.testing.localizer_checks`; ``facts`` are facts the model answers (their target is
its greedy token, :func:`~capinterp.testing.localizer_checks.check_facts`), which the checks break.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from capinterp.core.example import Example
from capinterp.core.protocol import Model
from capinterp.core.tokens import TokenizationError
from capinterp.localizers.base import Localizer
from capinterp.testing.contract import ContractError, ForwardCounter, require

__all__ = [
    "BAD_EXAMPLES",
    "bad_data",
    "bad_examples",
    "bare_prompts",
    "check_bad_data",
    "check_bad_examples",
    "check_bare_prompt",
]

#: The names of :func:`bad_examples`' entries, in order (known without a model).
BAD_EXAMPLES: tuple[str, ...] = (
    "empty target",
    "blank target",
    "prompt ending in absorbable whitespace",
    "over-long prompt",
    "empty dataset",
)


def _as_dict(ex: Example | dict, **change: Any) -> dict[str, Any]:
    """A fact as a dict (``prompt``, ``target``, ``subject`` where it has one), with ``change`` applied."""
    if isinstance(ex, dict):
        d = dict(ex)
    else:
        d = {"prompt": ex.prompt, "target": ex.target}
        if "subject" in ex.meta:
            d["subject"] = ex.meta["subject"]
    d.update(change)
    return d


def bare_prompts(facts: list) -> list[dict[str, Any]]:
    """``facts`` without their targets: bare prompts (with their ``subject``)."""
    return [{k: v for k, v in _as_dict(f).items() if k != "target"} for f in facts]


def bad_data(facts: list) -> dict[str, Any]:
    """Datasets of the wrong shape, by name: every ``fit`` refuses each with a ValueError or TypeError."""
    good = _as_dict(facts[0])
    return {
        "an empty list": [],
        "a bare string": good["prompt"],
        "bytes": good["prompt"].encode(),
        "an integer": 3,
        "a mapping": {good["prompt"]: good["target"]},
        "an item with an empty prompt": [good, ("", good["target"])],
        "a dict item with an empty prompt": [good, {"prompt": "", "target": good["target"]}],
        "an integer item": [good, 7],
        "a None item": [good, None],
    }


def bad_examples(model: Model, facts: list) -> dict[str, tuple[list, type[Exception]]]:
    """Bad examples, by name -> (data, the exception type every entry point raises for it): an empty
    or blank target, a prompt ending in whitespace the target would absorb, a prompt longer than the
    model's context, an empty dataset. Built from ``facts`` (so each item keeps its ``subject``)."""
    n_ctx = int(model.cfg.n_ctx)
    out: dict[str, tuple[list, type[Exception]]] = {
        "empty target": ([_as_dict(f, target="") for f in facts], TokenizationError),
        "blank target": ([_as_dict(f, target=" \n") for f in facts], TokenizationError),
        "prompt ending in absorbable whitespace": (
            [_as_dict(f, prompt=_as_dict(f)["prompt"] + " ") for f in facts],
            TokenizationError,
        ),
        "over-long prompt": (  # every repeat is at least one token
            [_as_dict(f, prompt="the city of " * n_ctx + _as_dict(f)["prompt"]) for f in facts],
            TokenizationError,
        ),
        "empty dataset": ([], ValueError),
    }
    return {name: out[name] for name in BAD_EXAMPLES}


def _refused(cls: type[Localizer], model: Model, params: dict, data: Any, what: str) -> BaseException:
    """The exception ``fit(data)`` raises; ContractError when it accepts it, runs the model first, or
    leaves a result behind."""
    loc = cls(model, **params)
    with ForwardCounter(model) as passes:
        try:
            loc.fit(data)
        except Exception as err:
            caught: BaseException = err
        else:
            require(False, f"fit accepted {what}")
    require(passes.n == 0, f"fit ran {passes.n} forward pass(es) before refusing {what}")
    require(not hasattr(loc, "units_"), f"fit refused {what} but left units_")
    return caught


def check_bad_data(cls: type[Localizer], model: Model, facts: list, params: dict, tmp: Path) -> None:
    """``fit`` refuses a dataset of the wrong shape (:func:`bad_data`: empty, a bare string, bytes,
    a bad item, ...) with a ValueError / TypeError, before any forward pass, and leaves no result."""
    for what, data in bad_data(facts).items():
        err = _refused(cls, model, params, data, what)
        require(
            isinstance(err, (ValueError, TypeError)),
            f"fit refused {what} with {type(err).__name__}, not a ValueError / TypeError: {err}",
        )


def check_bad_examples(cls: type[Localizer], model: Model, facts: list, params: dict, tmp: Path) -> None:
    """``fit`` refuses each of :func:`bad_examples` with exactly the exception type every entry point
    raises for it (TokenizationError for a bad target or prompt, ValueError for no data), before any
    forward pass."""
    for what, (data, expected) in bad_examples(model, facts).items():
        err = _refused(cls, model, params, data, f"data with {what}")
        require(
            type(err) is expected,
            f"fit refused data with {what} with {type(err).__name__}, not {expected.__name__} "
            f"as every entry point does: {err}",
        )


def check_bare_prompt(cls: type[Localizer], model: Model, facts: list, params: dict, tmp: Path) -> None:
    """The bare-prompt rule: a class declaring ``fills_greedy`` fits bare prompts as the same facts
    with the model's greedy token as target (the same ``units_``); any other refuses them with
    TokenizationError ("empty target") before any forward pass."""
    bare = bare_prompts(facts)
    if not cls.fills_greedy:
        err = _refused(cls, model, params, bare, "bare prompts (no target) without declaring fills_greedy")
        require(
            isinstance(err, TokenizationError) and "empty target" in str(err),
            f"bare prompts refused with {type(err).__name__} ({err}), not the TokenizationError "
            "('empty target') of capinterp.core.tokens.encode",
        )
        return
    try:
        filled: Any = cls(model, **params).fit(bare)
    except Exception as err:
        raise ContractError(
            f"declares fills_greedy but fit refused bare prompts ({type(err).__name__}: {err})"
        ) from err
    answered: Any = cls(model, **params).fit(facts)  # facts' targets are the model's greedy tokens
    require(
        filled.units_ == answered.units_,
        "bare prompts gave other units_ than the same prompts with the greedy token as target",
    )
