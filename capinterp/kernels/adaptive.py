"""The adaptive rule of the IG kernel: per layer, a rule refined until the layer's error estimate
is below ``config.tol`` (``rule="adaptive"`` in :func:`capinterp.kernels.ig.ig_scores`).

Every layer starts with Gauss-Legendre on 4 nodes. Two refinement schedules (:func:`rule_of`):

* ``"graded"``, for a zero baseline on a model whose FFN output is scale invariant (Gemma 2/3:
  ``resid += RMSNorm_post(W_out a)``). There ``F(alpha a)`` is constant in ``alpha`` down to
  ``alpha_c ~ sqrt(eps / ms(W_out a))``, where the norm's ``eps`` takes over, and ``F(0)`` differs
  from ``F(a)``: per neuron the integrand is ~``c_i / alpha`` down to ``alpha_c``, and their sum
  ``dF(alpha a) / d alpha`` a bump of width ~``alpha_c`` next to 0 (:mod:`capinterp.kernels.invariant`;
  ``benchmarks/bench_ig_accuracy.py --shape``), which Gauss-Legendre on ``[0, 1]`` resolves only slowly. Round ``r >= 1`` uses
  :func:`~capinterp.kernels.quadrature.graded` with ``2r - 1`` panels shrinking by 4 towards 0
  (plus ``[0, 4^-(2r-1)]``) and ``3 + r`` nodes on each: 8, 20, 36, 56, 80, 108 nodes, reaching
  down to alpha = 0.25, 1.6e-2, 1e-3, 6e-5, 3.8e-6, 2.4e-7; each round is finer both at 0 and on
  the rest of the path.
* ``"doubling"`` elsewhere: Gauss-Legendre on ``[0, 1]``, nodes doubled (8, 16, 32, 64, 128).
  Where the integrand varies on the whole path (SmolLM2's layer 0: ``benchmarks/bench_ig_accuracy.py
  --shape``) Gauss-Legendre's exponential convergence pays more than grading.

``"auto"`` (:data:`SCHEDULE`) picks between them from the caller's ``singular_at_zero``.

Each round runs the rows of all layers not yet converged in **one** call of the batched
prefix-reuse kernel (``run``), so converged layers drop out and cost nothing more. A layer's
estimate after round ``r >= 1`` is the larger of

* the nested difference ``||IG(rule r) - IG(rule r-1)||_2 / ||IG(rule r)||_2`` (the error of the
  coarser rule, which bounds that of the finer one the layer returns when both converge);
* the completeness violation ``|sum IG - (F(x) - F(b))| / max(|F(x) - F(b)|, ||IG||_1)``
  (a lower bound on the relative L1 error of the scores, :mod:`capinterp.kernels.completeness`).

A layer is done when it is <= ``tol``, or when the next rule would have more than ``max_steps``
nodes (then it is listed in ``capped``). The returned scores are the last (finest) rule's.
Measured per layer on Gemma 3 and SmolLM2: ``benchmarks/bench_ig_accuracy.py --adaptive-only``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from capinterp.kernels.completeness import completeness_error_l1
from capinterp.kernels.ig_config import IGConfig
from capinterp.kernels.quadrature import graded, quadrature

__all__ = ["SCHEDULE", "SCHEDULES", "START", "AdaptiveResult", "adaptive_ig", "rule_of"]

#: Gauss-Legendre nodes of the first round.
START = 4
#: Refinement schedules (module docstring); :data:`SCHEDULE` is the one :func:`adaptive_ig` uses by default.
SCHEDULES = ("auto", "graded", "doubling")
SCHEDULE = "auto"


def rule_of(r: int, schedule: str = "graded", start: int = START) -> tuple[int, int, int]:
    """``(levels, per_level, growth)`` of round ``r`` (:func:`~capinterp.kernels.quadrature.graded`):
    ``(0, start, 0)`` first; graded: ``(2r - 1, start - 1 + r, 0)``; doubling: ``(0, start 2^r, 0)``."""
    if schedule == "doubling":
        return 0, start * 2**r, 0
    return (0, start, 0) if r == 0 else (2 * r - 1, start - 1 + r, 0)


def _nodes(rule: tuple[int, int, int]) -> int:
    levels, per_level, growth = rule
    return (levels + 1) * per_level + growth * levels * (levels + 1) // 2


@dataclass
class AdaptiveResult:
    """Per layer (dict keyed by layer): scores [d_mlp] float64, F at the baseline, nodes of the
    final rule, its panels below 1 (``levels``), final error estimate; ``f_clean``; ``capped`` =
    layers that stopped at the cap."""

    scores: dict[int, torch.Tensor] = field(default_factory=dict)
    f_base: dict[int, float] = field(default_factory=dict)
    nodes: dict[int, int] = field(default_factory=dict)
    levels: dict[int, int] = field(default_factory=dict)
    error: dict[int, float] = field(default_factory=dict)
    f_clean: float = math.nan
    capped: list[int] = field(default_factory=list)
    rounds: int = 0


def _estimate(cur: torch.Tensor, prev: torch.Tensor | None, f_clean: float, f_base: float) -> float:
    comp = completeness_error_l1(float(cur.sum()), float(cur.abs().sum()), f_clean, f_base)
    if prev is None:
        return comp
    nested = float((cur - prev).norm()) / max(float(cur.norm()), 1e-30)
    return max(nested, comp)


def adaptive_ig(
    run: Callable[[list[int], torch.Tensor, torch.Tensor], tuple[torch.Tensor, float, torch.Tensor]],
    layers: list[int],
    config: IGConfig,
    start: int = START,
    schedule: str | None = None,
    singular_at_zero: bool = False,
) -> AdaptiveResult:
    """Refine per layer until the estimate is <= ``config.tol``, at most ``config.max_steps``
    nodes (module docstring; the other fields of ``config`` are ``run``'s).

    ``run(layers, alphas, weights)`` -> ``(scores [len(layers), d_mlp], F(x), F(baseline) [len(layers)])``
    for the rule ``(alphas, weights)`` on those layers: one batched kernel call.
    ``schedule``: one of :data:`SCHEDULES` (None: :data:`SCHEDULE`); ``"auto"`` is ``"graded"``
    when ``singular_at_zero`` (zero baseline, scale-invariant FFN output), else ``"doubling"``.
    """
    tol, max_steps = config.tol, config.max_steps
    schedule = SCHEDULE if schedule is None else schedule
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    if schedule == "auto":
        schedule = "graded" if singular_at_zero else "doubling"
    start = max(1, min(start, max_steps))
    res = AdaptiveResult()
    prev: dict[int, torch.Tensor] = {}
    pending, r = list(layers), 0
    while pending:
        rule = rule_of(r, schedule, start)
        alphas, weights = graded(rule[0], rule[1], growth=rule[2]) if rule[0] else quadrature(rule[1], "gauss")
        scores, f_clean, f_base = run(pending, alphas, weights)
        res.f_clean, res.rounds = float(f_clean), res.rounds + 1
        last = _nodes(rule_of(r + 1, schedule, start)) > max_steps
        keep = []
        for j, l in enumerate(pending):
            cur = scores[j].double()
            est = _estimate(cur, prev.get(l), res.f_clean, float(f_base[j]))
            if (l in prev and est <= tol) or last:
                res.scores[l], res.f_base[l], res.error[l] = cur, float(f_base[j]), est
                res.nodes[l], res.levels[l] = len(alphas), rule[0]
                if est > tol:
                    res.capped.append(l)
            else:
                prev[l] = cur
                keep.append(l)
        pending, r = keep, r + 1
    return res
