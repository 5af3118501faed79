"""Single-unit ablation on the task, shared by every card kind (:func:`ablate_each`).

:func:`ablate_each` evaluates the task once unablated and once under each patch, and reports each
patch's ``{"prob", "accuracy", "delta_prob", "delta_accuracy"}``: the task's mean target
probability and accuracy under the patch, and their change from the unablated model
(:func:`capinterp.kernels.evaluate`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

from capinterp.core.example import Example

__all__ = ["ablate_each"]


def ablate_each(
    model: Any,
    examples: list[Example],
    patches: Sequence[Callable[[], AbstractContextManager[Any]]],
    batch_size: int,
) -> list[dict[str, float]]:
    """One result per patch (a callable returning the context manager that ablates one unit)."""
    from capinterp.kernels.evaluate import evaluate

    if not patches:
        return []
    base = evaluate(model, examples, batch_size=batch_size, progress=False)
    out = []
    for patch in patches:
        with patch():
            res = evaluate(model, examples, batch_size=batch_size, progress=False)
        out.append(
            {
                "prob": res.mean_prob,
                "accuracy": res.accuracy,
                "delta_prob": res.mean_prob - base.mean_prob,
                "delta_accuracy": res.accuracy - base.accuracy,
            }
        )
    return out
