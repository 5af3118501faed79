"""The adaptive rule of the IG kernel: per layer, Gauss-Legendre nodes doubled until the layer's
error estimate is below ``config.tol`` (``rule="adaptive"`` in :func:`capinterp.kernels.ig.ig_scores`).

Every layer starts with :data:`START` Gauss-Legendre nodes; each round doubles the nodes of the
layers not yet converged and runs all their rows in **one** call of the batched IG rows
(``run``), so converged layers drop out and cost nothing more. A layer's estimate after a
round with ``2n`` nodes is the larger of

* the nested difference ``||IG(GL-2n) - IG(GL-n)||_2 / ||IG(GL-2n)||_2`` (Gauss-Legendre converges
  exponentially on a smooth path, so this bounds the error of GL-n and, with margin, of GL-2n);
* the completeness violation ``|sum IG - (F(x) - F(b))| / max(|F(x) - F(b)|, ||IG||_1)``
  (a lower bound on the relative L1 error of the scores, :mod:`capinterp.kernels.completeness`).

A layer is done when it is <= ``tol``, or when doubling would pass ``max_steps`` (then it is
listed in ``capped``). The returned scores are the last (finest) rule's.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from capinterp.kernels.ig_config import IGConfig
from capinterp.kernels.quadrature import quadrature

__all__ = ["START", "AdaptiveResult", "adaptive_ig"]

#: Gauss-Legendre nodes of the first round.
START = 4


@dataclass
class AdaptiveResult:
    """Per layer (dict keyed by layer): scores [d_mlp] float64, F at the baseline, nodes of the
    final rule, final error estimate; ``f_clean``; ``capped`` = layers that stopped at the cap."""

    scores: dict[int, torch.Tensor] = field(default_factory=dict)
    f_base: dict[int, float] = field(default_factory=dict)
    nodes: dict[int, int] = field(default_factory=dict)
    error: dict[int, float] = field(default_factory=dict)
    f_clean: float = math.nan
    capped: list[int] = field(default_factory=list)
    rounds: int = 0


def _estimate(cur: torch.Tensor, prev: torch.Tensor | None, f_clean: float, f_base: float) -> float:
    delta = f_clean - f_base
    comp = abs(float(cur.sum()) - delta) / max(abs(delta), float(cur.abs().sum()), 1e-30)
    if prev is None:
        return comp
    nested = float((cur - prev).norm()) / max(float(cur.norm()), 1e-30)
    return max(nested, comp)


def adaptive_ig(
    run: Callable[[list[int], torch.Tensor, torch.Tensor], tuple[torch.Tensor, float, torch.Tensor]],
    layers: list[int],
    config: IGConfig,
    start: int = START,
) -> AdaptiveResult:
    """Refine per layer until the estimate is <= ``config.tol``, at most ``config.max_steps``
    nodes (module docstring; the other fields of ``config`` are ``run``'s).

    ``run(layers, alphas, weights)`` -> ``(scores [len(layers), d_mlp], F(x), F(baseline) [len(layers)])``
    for the rule ``(alphas, weights)`` on those layers: one batched call.
    """
    tol, max_steps = config.tol, config.max_steps
    res = AdaptiveResult()
    prev: dict[int, torch.Tensor] = {}
    pending, n = list(layers), max(1, min(start, max_steps))
    while pending:
        alphas, weights = quadrature(n, "gauss")
        scores, f_clean, f_base = run(pending, alphas, weights)
        res.f_clean, res.rounds = float(f_clean), res.rounds + 1
        last = 2 * n > max_steps
        keep = []
        for j, l in enumerate(pending):
            cur = scores[j].double()
            est = _estimate(cur, prev.get(l), res.f_clean, float(f_base[j]))
            if (l in prev and est <= tol) or last:
                res.scores[l], res.f_base[l], res.nodes[l], res.error[l] = cur, float(f_base[j]), n, est
                if est > tol:
                    res.capped.append(l)
            else:
                prev[l] = cur
                keep.append(l)
        pending, n = keep, 2 * n
    return res
