"""The statistics of a certificate: stratified sampling plan and bounds, pure functions of numbers.

Nothing here touches a model: :func:`plan` splits the units outside a located set into score
strata and allocates the budget, :func:`draw` samples each stratum uniformly without replacement,
and :func:`bounds` turns the sampled values (each in [0, 1]) into one-sided upper confidence
bounds: an exact hypergeometric bound per stratum (Bonferroni over the strata) on the number of
units above ``tau``, and a Hoeffding bound (Hoeffding 1963, Theorem 4: valid without replacement)
on the part below ``tau`` plus the count bound for the part above it, on their total. The proofs
are in ``docs/certify.md``; the coverage experiment (:mod:`capinterp.interventions.certify_coverage`)
checks them by simulation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = ["Bounds", "Plan", "bounds", "draw", "hypergeom_cdf", "hypergeom_upper", "plan"]


@dataclass(frozen=True)
class Plan:
    """Strata of the outside units (``members[h]``: positions into the outside units, best score
    first) and the number of exact patches each gets (``take[h] <= len(members[h])``)."""

    members: tuple[np.ndarray, ...]
    take: tuple[int, ...]

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(len(m) for m in self.members)


@dataclass(frozen=True)
class Bounds:
    """Upper bounds (each at confidence ``1 - delta``) and the plug-in estimates."""

    count_bound: int
    count_estimate: float
    total_bound: float
    total_estimate: float


def _strata_sizes(n: int, strata: int) -> list[int]:
    """Geometric strata, best first: with ``H`` strata the top two hold ``n / 2**(H-1)`` each and
    each next one twice as many (H = 3: a quarter, a quarter, a half); each at least one unit."""
    h = max(1, min(strata, n))
    fracs = [2.0 ** -(h - 1)] + [2.0 ** -(h - j) for j in range(1, h)]
    cuts = np.round(np.cumsum(fracs) * n).astype(int)
    cuts = np.maximum(cuts, np.arange(1, h + 1))  # every stratum non-empty
    cuts[-1] = n
    sizes = np.diff(np.concatenate([[0], cuts])).tolist()
    return [int(s) for s in sizes if s > 0]


def plan(scores: np.ndarray, budget: int, strata: int = 1, top: int = 0) -> Plan:
    """The sampling plan for ``len(scores)`` outside units, by |score| (ties by position), best
    first: the ``top`` best units form a stratum patched whole (exact, no uncertainty), and the
    rest are split into ``strata`` geometric strata (:func:`_strata_sizes`) sharing the remaining
    budget equally, a full stratum's unused share going to the others (so a higher stratum, being
    smaller, is sampled more densely). Depends on the scores only, never on an effect, which the
    bounds' validity needs."""
    s = np.abs(np.asarray(scores, dtype=float))
    n = len(s)
    order = np.lexsort((np.arange(n), -s))  # best first, stable
    head = min(int(top), int(budget), n)
    rest = order[head:]
    sizes = _strata_sizes(len(rest), strata) if len(rest) else []
    members = ((order[:head],) if head else ()) + tuple(np.split(rest, np.cumsum(sizes)[:-1]) if sizes else ())
    take = [0] * len(sizes)
    left = min(int(budget) - head, len(rest))
    while left > 0:  # water-filling: equal shares, capped at each stratum's size
        open_ = [h for h in range(len(sizes)) if take[h] < sizes[h]]
        share = max(1, left // len(open_))
        for h in open_:
            add = min(share, sizes[h] - take[h], left)
            take[h] += add
            left -= add
            if left == 0:
                break
    return Plan(members, ((head,) if head else ()) + tuple(take))


def draw(p: Plan, rng: np.random.Generator) -> list[np.ndarray]:
    """Per stratum, ``take[h]`` of its members drawn uniformly without replacement."""
    return [m[rng.permutation(len(m))[:t]] for m, t in zip(p.members, p.take)]


def hypergeom_cdf(k: int, big_n: int, c: int, n: int) -> float:
    """P(X <= k) for X hypergeometric: ``n`` draws without replacement from ``big_n`` units of which
    ``c`` are marked."""
    lo, hi = max(0, n - (big_n - c)), min(n, c)
    if k < lo:
        return 0.0
    if k >= hi:
        return 1.0

    def lchoose(a: int, b: int) -> float:
        return math.lgamma(a + 1) - math.lgamma(b + 1) - math.lgamma(a - b + 1)

    logs = np.array([lchoose(c, j) + lchoose(big_n - c, n - j) for j in range(lo, k + 1)]) - lchoose(big_n, n)
    top = logs.max()
    return float(min(1.0, math.exp(top) * np.exp(logs - top).sum()))


def hypergeom_upper(k: int, n: int, big_n: int, delta: float) -> int:
    """Exact one-sided upper confidence bound on the number ``c`` of marked units among ``big_n``,
    from ``k`` marked in ``n`` drawn without replacement: the largest ``c`` with
    ``P(X <= k | c) > delta`` (P(X <= k | c) falls as c grows, so P(c > bound) <= delta)."""
    if n >= big_n:
        return int(k)
    if n == 0:
        return int(big_n)
    lo, hi = k, big_n - (n - k)  # P(X <= k | lo) = 1 > delta; find the last c with cdf > delta
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if hypergeom_cdf(k, big_n, mid, n) > delta:
            lo = mid
        else:
            hi = mid - 1
    return int(lo)


def _count(sizes, takes, samples, tau: float, delta: float) -> tuple[list[int], float]:
    """(per-stratum upper bounds at ``1 - delta`` jointly, estimate) of the number of units with a
    value above ``tau``: exhausted strata are exact, unsampled ones count whole, the partly sampled
    ones share ``delta`` (Bonferroni)."""
    partial = sum(1 for N, n in zip(sizes, takes) if 0 < n < N)
    per, est = [], 0.0
    for N, n, x in zip(sizes, takes, samples):
        k = int((x > tau).sum())
        per.append(hypergeom_upper(k, n, N, delta / max(partial, 1)))
        est += N * k / n if n else N
    return per, est


def bounds(sizes, takes, samples, tau: float, delta: float) -> Bounds:
    """The certificate's bounds from the sampled values of each stratum (``samples[h]``: the
    ``takes[h]`` values drawn from the ``sizes[h]`` units of stratum h, each in [0, 1]).

    Count: :func:`hypergeom_upper` per stratum at ``delta / (partly sampled strata)``.
    Total: write each value as ``min(x, tau) + (x - tau)+``; the first part's total is at most its
    stratified estimate plus ``tau * sqrt(log(2 / delta) * sum_h N_h**2 / (2 n_h))`` (Hoeffding,
    one bound over all strata, at ``delta / 2``), the second's at most ``(1 - tau)`` times the count
    bound at ``delta / 2`` (exactly known in an exhausted stratum). With every stratum exhausted both
    bounds are the exact values."""
    samples = [np.clip(np.asarray(x, dtype=float), 0.0, 1.0) for x in samples]
    if any(len(x) != n or n > N for x, n, N in zip(samples, takes, sizes)):
        raise ValueError("each stratum needs takes[h] <= sizes[h] sampled values")
    count_per, count_est = _count(sizes, takes, samples, tau, delta)
    spread = sum(N * N / (2.0 * n) for N, n in zip(sizes, takes) if 0 < n < N)
    low = sum(N * np.minimum(x, tau).mean() if n else N * tau for N, n, x in zip(sizes, takes, samples))
    low_bound = min(low + tau * math.sqrt(math.log(2.0 / delta) * spread), tau * sum(sizes))
    high_per, _ = _count(sizes, takes, samples, tau, delta / 2.0)
    high = sum(  # exhausted strata: their exact excess over tau; the others: (1 - tau) x the count bound
        float(np.maximum(x - tau, 0.0).sum()) if n == N else (1.0 - tau) * c
        for N, n, x, c in zip(sizes, takes, samples, high_per)
    )
    total_bound = min(low_bound + high, float(sum(sizes)))
    total_est = sum(N * x.mean() if n else float(N) for N, n, x in zip(sizes, takes, samples))
    return Bounds(int(sum(count_per)), float(count_est), float(total_bound), float(total_est))
