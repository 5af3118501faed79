"""Coverage of the certificate's bounds by simulation: seeded trials on a population of known effects.

Given every outside unit's exact value (computed once, exhaustively) and its score, each trial
draws the sample :func:`capinterp.interventions.certify.certify` would draw with another seed and
evaluates the bounds; coverage is the share of trials whose bound is at least the truth. The plug-in
estimates run beside them as a control: they are no bounds, and their coverage shows what a test
of coverage catches.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from capinterp.interventions.certify_bounds import bounds, draw, plan

__all__ = ["COLUMNS", "coverage", "min_coverage", "synthetic_population", "table"]

COLUMNS = [
    "setting",
    "n_outside",
    "budget",
    "strata",
    "top",
    "tau",
    "delta",
    "trials",
    "true_count",
    "count_coverage",
    "mean_count_bound",
    "true_total",
    "total_coverage",
    "mean_total_bound",
    "estimate_coverage",
    "coverage_floor",
]


def min_coverage(delta: float, trials: int, z: float = 3.0) -> float:
    """The lowest observed coverage a bound at ``1 - delta`` may show in ``trials`` trials: ``z``
    binomial standard errors below ``1 - delta``."""
    return 1.0 - delta - z * math.sqrt(delta * (1.0 - delta) / trials)


def coverage(
    values: Any,
    scores: Any,
    *,
    budget: int,
    tau: float,
    delta: float,
    strata: int = 1,
    top: int = 0,
    trials: int = 200,
    seed: int = 0,
    setting: str = "",
) -> dict[str, Any]:
    """One row of :data:`COLUMNS`: ``values`` [n] every outside unit's value in [0, 1] (the positive
    part, or size, of its exact effect), ``scores`` [n] the localizer's scores that set the strata."""
    x = np.clip(np.asarray(values, dtype=float), 0.0, 1.0)
    p = plan(np.asarray(scores, dtype=float), budget, strata, top)
    true_count, true_total = int((x > tau).sum()), float(x.sum())
    rng = np.random.default_rng(seed)
    res = [bounds(p.sizes, p.take, [x[i] for i in draw(p, rng)], tau, delta) for _ in range(trials)]
    count = np.array([b.count_bound for b in res])
    total = np.array([b.total_bound for b in res])
    est = np.array([b.total_estimate for b in res])
    return {
        "setting": setting,
        "n_outside": len(x),
        "budget": budget,
        "strata": strata,
        "top": min(top, budget),
        "tau": tau,
        "delta": delta,
        "trials": trials,
        "true_count": true_count,
        "count_coverage": float((count >= true_count).mean()),
        "mean_count_bound": float(count.mean()),
        "true_total": true_total,
        "total_coverage": float((total >= true_total - 1e-9).mean()),
        "mean_total_bound": float(total.mean()),
        "estimate_coverage": float((est >= true_total).mean()),
        "coverage_floor": min_coverage(delta, trials),
    }


def synthetic_population(n: int, hits: int, size: float, seed: int = 0, informative: bool = True):
    """(values [n], scores [n]): ``hits`` units of value ``size``, the rest a small exponential tail
    (mean 1e-4); scores are the values times log-normal noise (``informative``: the ranking is
    mostly right) or pure noise."""
    rng = np.random.default_rng(seed)
    x = np.minimum(rng.exponential(1e-4, n), 1.0)
    x[rng.choice(n, hits, replace=False)] = size
    noise = rng.lognormal(0.0, 1.0, n)
    return x, (x * noise if informative else noise)


def table(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """Rows of :func:`coverage` as a frame of :data:`COLUMNS`."""
    return pd.DataFrame(rows, columns=COLUMNS)
