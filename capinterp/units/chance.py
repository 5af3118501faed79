"""Chance levels of set metrics: what two random sets of the same sizes would score.

Draw A (size a) and B (size b) uniformly at random, independently, from a universe of N units.
Their intersection X follows the hypergeometric law

    P(X = k) = C(a, k) C(N - a, b - k) / C(N, b),   max(0, a + b - N) <= k <= min(a, b),

so every set metric that is a function of (X, a, b) has an exact expected value
E[f(X)] = sum_k P(X = k) f(k):

- overlap      f(k) = k / min(a, b)   -> E = a b / (N min(a, b))
- iou          f(k) = k / (a + b - k) (no closed form; summed exactly)
- cohesion     f(k) = k / max(a, b)   (and separability, the same formula)

The p-value of an observed intersection x is the upper tail P(X >= x): how often two random
sets of these sizes share at least as many units. Probabilities are summed in log space
(``math.lgamma``), so universes of millions of units and sets of thousands stay exact to
float64 rounding.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from capinterp.core import validate
from capinterp.units.base import UnitSet
from capinterp.units.counts import SetLike, set_counts

__all__ = ["CHANCE_METRICS", "Chance", "bootstrap_ci", "chance", "chance_stats", "hypergeom_pmf"]

#: f(k, a, b) per metric, for a + b > 0 (two empty sets score 1 by convention, see metrics).
CHANCE_METRICS: dict[str, Callable[[np.ndarray, int, int], np.ndarray]] = {
    "overlap": lambda k, a, b: k / min(a, b) if min(a, b) else np.zeros_like(k),
    "iou": lambda k, a, b: k / (a + b - k),
    "cohesion": lambda k, a, b: k / max(a, b),
    "separability": lambda k, a, b: k / max(a, b),
}


@dataclass(frozen=True)
class Chance:
    """A metric beside its chance level.

    ``observed``: the metric of the two given sets; ``expected``: its exact mean over two random
    sets of the same sizes; ``p_value``: P(|A' ∩ B'| >= |A ∩ B|) for random A', B';
    ``intersection`` / ``expected_intersection``: |A ∩ B| and its chance mean a b / N.
    """

    metric: str
    observed: float
    expected: float
    p_value: float
    intersection: int
    expected_intersection: float
    sizes: tuple[int, int]
    n_units: int

    def as_dict(self) -> dict:
        return {
            "metric": self.metric,
            "observed": self.observed,
            "chance": self.expected,
            "p_value": self.p_value,
            "intersection": self.intersection,
            "chance_intersection": self.expected_intersection,
            "sizes": list(self.sizes),
            "n_units": self.n_units,
        }


def hypergeom_pmf(n_units: int, a: int, b: int) -> tuple[np.ndarray, np.ndarray]:
    """(k, P(X = k)) for the intersection X of random sets of sizes ``a`` and ``b`` in ``n_units``."""
    n = validate.integer("n_units", n_units, low=1)
    a = validate.integer("size of the first set", a, low=0, high=n)
    b = validate.integer("size of the second set", b, low=0, high=n)
    k = np.arange(max(0, a + b - n), min(a, b) + 1)

    def log_choose(m: int, j: np.ndarray) -> np.ndarray:
        return np.array([math.lgamma(m + 1) - math.lgamma(i + 1) - math.lgamma(m - i + 1) for i in j])

    log_p = log_choose(a, k) + log_choose(n - a, b - k) - log_choose(n, np.array([b]))[0]
    p = np.exp(log_p - log_p.max())
    return k, p / p.sum()


def _universe(a: SetLike, b: SetLike, n_units: int | None) -> int:
    if n_units is not None:
        return validate.integer("n_units", n_units, low=1)
    sizes = {s.n_units for s in (a, b) if isinstance(s, UnitSet) and s.n_units is not None}
    if len(sizes) != 1:
        raise ValueError(
            "chance needs the size of the unit universe: pass n_units= (the sets do not know it"
            + (f"; they disagree: {sorted(sizes)})" if sizes else ")")
        )
    return sizes.pop()


def chance(
    a: SetLike, b: SetLike, metric: str = "overlap", *, n_units: int | None = None, across_models: bool = False
) -> Chance:
    """The metric of ``a`` and ``b``, its exact expected value for two random sets of the same
    sizes in the same universe, and the upper-tail p-value of the observed intersection.

    ``n_units`` defaults to the sets' own universe (``NeuronSet``: n_layers x d_mlp; a layer
    ``KeySet``: n_layers); plain python sets need it.
    """
    validate.choice("metric", metric, CHANCE_METRICS)
    inter, na, nb = set_counts(a, b, across_models)
    n = _universe(a, b, n_units)
    if max(na, nb) > n:
        raise ValueError(f"a set has more units ({max(na, nb)}) than the universe (n_units={n})")
    if na == 0 and nb == 0:  # both empty: identical sets, metric 1 whatever happens
        return Chance(metric, 1.0, 1.0, 1.0, 0, 0.0, (0, 0), n)
    k, p = hypergeom_pmf(n, na, nb)
    f = CHANCE_METRICS[metric]
    observed = float(f(np.array([inter], dtype=float), na, nb)[0])
    expected = float((p * f(k.astype(float), na, nb)).sum())
    p_value = float(min(1.0, p[k >= inter].sum()))
    return Chance(metric, observed, expected, p_value, inter, na * nb / n, (na, nb), n)


def chance_stats(a: SetLike, b: SetLike, names: tuple[str, ...] = ("overlap", "iou"), **kw) -> dict[str, float]:
    """``{"<metric>_chance": expected, ..., "p_value": P(intersection >= observed)}``: the columns
    an experiment reports beside its observed metrics (``kw`` as :func:`chance`)."""
    out: dict[str, float] = {}
    for name in names:
        c = chance(a, b, name, **kw)
        out[f"{name}_chance"] = c.expected
    out["p_value"] = c.p_value
    return out


def bootstrap_ci(
    values: np.ndarray | list[float],
    statistic: Callable[[np.ndarray], float] = np.mean,
    *,
    n_boot: int = 2000,
    level: float = 0.95,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile bootstrap interval of ``statistic`` over ``values`` (e.g. per-fact CS1 or
    per-split overlaps): resample the values with replacement ``n_boot`` times, return the
    ``(1 - level) / 2`` and ``(1 + level) / 2`` quantiles. NaN values are dropped first; fewer
    than two values give ``(nan, nan)``."""
    v = np.asarray(values, dtype=float).ravel()
    v = v[~np.isnan(v)]
    n_boot = validate.positive_int("n_boot", n_boot)
    level = validate.finite_float("level", level, low=0.0, high=1.0, low_open=True, high_open=True)
    if v.size < 2:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    stats = np.array([statistic(v[rng.integers(0, v.size, v.size)]) for _ in range(n_boot)])
    lo, hi = np.quantile(stats, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)
