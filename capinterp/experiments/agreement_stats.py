"""Correlations of attribution scores with exact effects, with percentile bootstrap intervals.

The intervals resample the units (neurons, layers, heads, edges) with replacement, ``n_boot`` times
from a seeded generator, and take the ``(1 - level) / 2`` and ``(1 + level) / 2`` quantiles of the
resampled Pearson and Spearman coefficients (Efron and Tibshirani 1993, "An Introduction to the
Bootstrap", the percentile interval). Resamples on which a coefficient is undefined (a constant
sample) are left out; with none left the bounds are NaN.
"""

from __future__ import annotations

import numpy as np

__all__ = ["CI_COLUMNS", "bootstrap_ci", "correlations", "stat_row"]

CI_COLUMNS = ["pearson", "pearson_lo", "pearson_hi", "spearman", "spearman_lo", "spearman_hi"]


def _ranks(x: np.ndarray) -> np.ndarray:
    """Average ranks from 0 (ties share their mean rank), as Spearman's coefficient needs."""
    s = np.sort(x)
    return (np.searchsorted(s, x, "left") + np.searchsorted(s, x, "right") - 1) / 2.0


def correlations(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """(Pearson, Spearman) of two samples; NaN where either is constant."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if len(a) < 2 or a.std() == 0 or b.std() == 0:
        return float("nan"), float("nan")
    ra, rb = _ranks(a), _ranks(b)
    spearman = float(np.corrcoef(ra, rb)[0, 1]) if ra.std() and rb.std() else float("nan")
    return float(np.corrcoef(a, b)[0, 1]), spearman


def _pearson_rows(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Pearson coefficient of each row pair of ``[n_boot, n]`` arrays; NaN for a constant row."""
    x = x - x.mean(1, keepdims=True)
    y = y - y.mean(1, keepdims=True)
    den = np.sqrt((x * x).sum(1) * (y * y).sum(1))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, (x * y).sum(1) / np.where(den > 0, den, 1), np.nan)


def bootstrap_ci(
    a: np.ndarray, b: np.ndarray, *, n_boot: int = 1000, level: float = 0.95, seed: int = 0
) -> tuple[float, float, float, float]:
    """``(pearson_lo, pearson_hi, spearman_lo, spearman_hi)``: percentile bootstrap over the units."""
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"a and b must be 1-d samples of one length, got {a.shape} and {b.shape}")
    if len(a) < 3:
        return (float("nan"),) * 4
    idx = np.random.default_rng(seed).integers(0, len(a), size=(n_boot, len(a)))
    # ranks within each resample: ranking once and resampling the ranks would not give ties their mean rank
    ra = np.stack([_ranks(r) for r in a[idx]])
    rb = np.stack([_ranks(r) for r in b[idx]])
    q = [(1 - level) / 2, (1 + level) / 2]
    out: list[float] = []
    for vals in (_pearson_rows(a[idx], b[idx]), _pearson_rows(ra, rb)):
        vals = vals[~np.isnan(vals)]
        out += [float(v) for v in np.quantile(vals, q)] if vals.size else [float("nan")] * 2
    return out[0], out[1], out[2], out[3]


def stat_row(predicted: np.ndarray, effect: np.ndarray, seed: int = 0) -> dict[str, float]:
    """The :data:`CI_COLUMNS` of one (method, component) comparison."""
    pearson, spearman = correlations(predicted, effect)
    p_lo, p_hi, s_lo, s_hi = bootstrap_ci(predicted, effect, seed=seed)
    return {
        "pearson": pearson,
        "pearson_lo": p_lo,
        "pearson_hi": p_hi,
        "spearman": spearman,
        "spearman_lo": s_lo,
        "spearman_hi": s_hi,
    }
