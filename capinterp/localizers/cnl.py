"""CNL: dataset-level capability neurons by integrated gradients (Huang et al. 2025, Sec. 5, Eqs. 7-8; docs/localizers/cnl.md).

    Attr_D(l, i) = mean over (x, y) in D of  a_{l,i} * (1/m) sum_k dF(a_l = (k/m) a_l) / da_{l,i}

summed over the teacher-forced answer positions, with F the mean probability of the answer
tokens. The mask keeps ``|Attr - mean| > sigma * std`` (global over all neurons, two-sided;
sigma = 6 as quoted by the reviewers). Cost: one fast IG kernel call per example
(:func:`capinterp.kernels.ig.ig_scores`); scores are running sums, so a ``checkpoint=``
makes long fits resumable and shards mergeable (:class:`capinterp.kernels.accumulate.ScoreSum`).
"""

from __future__ import annotations

from typing import Any

import torch

from capinterp.core import validate
from capinterp.core.tokens import Encoded
from capinterp.kernels.ig import INVARIANCE, METHODS, OBJECTIVES, POSITIONS, ig_scores
from capinterp.kernels.memory import ig_row_bytes
from capinterp.kernels.quadrature import check_rule
from capinterp.localizers.base import former_name, register
from capinterp.localizers.dataset import DatasetNeuronLocalizer

__all__ = ["CNL", "check_ig_args"]


def check_ig_args(steps: int, rule: str, positions: str, objective: str, kernel: str) -> None:
    """Validate IG hyper-parameters at construction, before any work (``kernel``: one of the IG
    kernel's ``METHODS``)."""
    validate.positive_int("steps", steps)
    try:
        check_rule(steps, rule)
    except ValueError as err:
        raise ValueError(f"unknown rule or too few steps: {err}") from None
    for name, value, allowed in (
        ("positions", positions, POSITIONS),
        ("objective", objective, OBJECTIVES),
        ("kernel", kernel, METHODS),
    ):
        if value not in allowed:
            raise ValueError(f"unknown {name} {value!r}; choose one of {', '.join(allowed)}")


@register("cnl")
class CNL(DatasetNeuronLocalizer):
    """Capability neurons: mean IG attribution over a dataset, then a sigma mask.

    Args:
        steps: interpolation points m (20, the KN/CNL grid).
        sigma: mask threshold in standard deviations of all scores (6).
        rule: quadrature of the IG path integral: ``"right"`` (k/m, weights 1/m: the papers'),
            ``"left"``, ``"midpoint"``, ``"trapezoid"``, ``"linspace"`` or ``"gauss"``
            (Gauss-Legendre; :mod:`capinterp.kernels.quadrature`).
        positions: ``"answer"`` (all answer-predicting positions) or ``"last_prompt"`` (KN-exact).
        objective: ``"prob"`` (default) or ``"logprob"``.
        kernel: IG kernel, ``"fast"`` (default) or the slower ``"prefix"`` / ``"loop"`` (same scores).
        invariance: ``"auto"`` (default) sums the rule in closed form from four nodes (3 rows per layer + 1 shared) on
            models whose FFN output is scale invariant (Gemma 2/3; scores within ~1e-4 of the
            largest, :mod:`capinterp.kernels.invariant`); ``"off"`` integrates node by node.
        batch_size: IG rows (layer x step points) per forward/backward; bounds peak memory.
            ``"auto"``: the largest that fits in free memory (halved on out-of-memory).
        **kwargs: passed to :class:`DatasetNeuronLocalizer`, e.g. ``checkpoint`` (a path;
            running sums are saved after every example and resumed from).
        method: former name of ``kernel`` (still accepted).
    """

    chunk_examples = 1

    def __init__(
        self,
        model: Any,
        *,
        steps: int = 20,
        sigma: float = 6.0,
        rule: str = "right",
        positions: str = "answer",
        objective: str = "prob",
        kernel: str = "fast",
        invariance: str = "auto",
        batch_size: int | str = 64,
        method: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(model, sigma=sigma, batch_size=batch_size, **kwargs)
        kernel = former_name(kernel, method, "kernel", "method", "fast")
        check_ig_args(steps, rule, positions, objective, kernel)
        self.steps, self.rule, self.positions = steps, rule, positions
        self.objective, self.kernel = objective, kernel
        self.invariance = validate.choice("invariance", invariance, INVARIANCE)

    def _row_bytes(self, items: list[Encoded]) -> int:
        longest = max(items, key=lambda it: len(it.prompt_ids) + len(it.target_ids))
        return ig_row_bytes(self.model, len(longest.prompt_ids) + len(longest.target_ids), len(longest.target_ids))

    def _score_chunk(self, items: list[Encoded]) -> torch.Tensor:
        return ig_scores(
            self.model,
            items,
            steps=self.steps,
            rule=self.rule,
            positions=self.positions,
            objective=self.objective,
            batch_size=self.batch_size_,
            method=self.kernel,
            invariance=self.invariance,
        )
