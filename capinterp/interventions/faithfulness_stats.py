"""The areas of faithfulness curves and their bootstrap intervals (:mod:`capinterp.interventions.faithfulness`).

With ``f(k) = (m(kept top-k) - m(∅)) / (m(N) - m(∅))`` and ``g(k)`` the same for the top-k
ablated (everything else running), over the fractions ``x = k / n_units`` (trapezoids, with the
curves' ends ``f(0) = 0``, ``f(1) = 1``, ``g(0) = 1``, ``g(1) = 0`` where no size measures them):

* ``CPR = ∫ f dx`` (sufficiency: higher is better), ``CMD = ∫ |1 - f| dx`` (lower is better);
* ``ablated_area = ∫ (1 - g) dx`` (necessity: the share of the behaviour lost when the top-k are
  removed, averaged over sizes; higher = more necessary). 0: removing the top-k loses nothing at any
  size short of all units; 1: removing any share loses all of it. Random units lose about their share,
  ``∫ x dx = 0.5`` where the behaviour is spread evenly; the random band gives the real value.

Bootstrap intervals resample the examples (with replacement, seeded) and recompute every mean
(the full model, everything ablated, each size's kept and ablated runs) from the per-example
metric values the curves were made of: no forward pass is repeated. Intervals are percentile
intervals (Efron & Tibshirani, *An Introduction to the Bootstrap*, 1993, ch. 13).
"""

from __future__ import annotations

import warnings

import numpy as np

__all__ = ["AREAS", "areas", "band", "bootstrap_areas", "curve_grid"]

#: The three areas, in the order :func:`areas` returns them.
AREAS = ("cpr", "cmd", "ablated_area")


def curve_grid(fractions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(x, pick)``: the curve's fractions with 0 and 1 added (a measured size at 1 wins over the
    assumed end), and the positions in ``[0, *fractions, 1]`` that give them."""
    x = np.concatenate([[0.0], np.asarray(fractions, dtype=np.float64), [1.0]])
    return np.unique(x, return_index=True)


def _trapezoid(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    return np.sum((x[1:] - x[:-1]) * (y[..., 1:] + y[..., :-1]) / 2, axis=-1)


def areas(
    grid: tuple[np.ndarray, np.ndarray], full: np.ndarray, empty: np.ndarray, kept: np.ndarray, ablated: np.ndarray
) -> np.ndarray:
    """``[..., 3]``: CPR, CMD and the ablated area (:data:`AREAS`) of curves with metric means
    ``full`` / ``empty`` (``[...]``) and ``kept`` / ``ablated`` per size (``[..., n_sizes]``);
    NaN where the full model and everything ablated give the same metric."""
    x, pick = grid
    full, empty = np.asarray(full, dtype=np.float64), np.asarray(empty, dtype=np.float64)
    span = (full - empty)[..., None]
    flat = np.abs(span) <= 1e-12
    with np.errstate(divide="ignore", invalid="ignore"):
        f = np.where(flat, np.nan, (kept - empty[..., None]) / np.where(flat, 1.0, span))
        g = np.where(flat, np.nan, (ablated - empty[..., None]) / np.where(flat, 1.0, span))

    def ends(v: np.ndarray) -> np.ndarray:
        lead = np.zeros(v.shape[:-1] + (1,))
        return np.concatenate([lead, v, lead + 1.0], -1)[..., pick]

    fy, lost = ends(f), ends(1.0 - g)
    return np.stack([_trapezoid(x, fy), _trapezoid(x, np.abs(1.0 - fy)), _trapezoid(x, lost)], -1)


def bootstrap_areas(
    grid: tuple[np.ndarray, np.ndarray],
    values: np.ndarray,
    *,
    resamples: int,
    seed: int,
    level: float = 0.95,
) -> np.ndarray:
    """``[3, 2]``: percentile intervals (low, high) of CPR, CMD and the ablated area.

    ``values``: per-example metric values ``[2 + 2 * n_sizes, n_examples]``: the full model, everything
    ablated, then per size the located set kept and ablated. NaN without resamples."""
    if resamples < 1:
        return np.full((len(AREAS), 2), np.nan)
    n = values.shape[1]
    idx = np.random.default_rng(seed).integers(0, n, size=(resamples, n))
    means = values[:, idx].mean(-1)  # [configs, resamples]
    per_k = means[2:].reshape(-1, 2, resamples)
    a = areas(grid, means[0], means[1], per_k[:, 0].T, per_k[:, 1].T)  # [resamples, 3]
    tail = (1.0 - level) / 2
    with warnings.catch_warnings():  # a flat curve (every resample NaN) gives NaN bounds
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.stack([np.nanquantile(a, tail, 0), np.nanquantile(a, 1 - tail, 0)], -1)


def band(v: np.ndarray) -> tuple[float, float, float]:
    """(mean, 5th, 95th percentile), NaN without draws."""
    v = np.asarray(v, dtype=np.float64)
    if not v.size:
        return (float("nan"),) * 3
    return float(v.mean()), float(np.quantile(v, 0.05)), float(np.quantile(v, 0.95))
