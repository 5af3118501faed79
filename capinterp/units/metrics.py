"""Metrics over located unit sets (Huang et al. 2025, Table 1 and Table 4; the DCSN paper, anon. 2025, Eq. 3; Chen et al. 2025, Sec. 3; docs/metrics.md).

Inputs are :class:`~capinterp.units.base.UnitSet` objects (``NeuronSet`` takes a tensor fast path) or
plain python sets / frozensets of keys. Two UnitSets must have the same ``kind`` and ``space``
(ValueError otherwise); a plain set is compared by keys only.

For sets A, B:

- ``overlap``     O   = |A ∩ B| / min(|A|, |B|)   (overlap coefficient; CNL's "Overlap")
- ``iou``         J   = |A ∩ B| / |A ∪ B|         (Jaccard)
- ``cohesion``    Coh = |A ∩ B| / max(|A|, |B|)   (same capability, two datasets; DCSN Eq. 3)
- ``separability``Sep = |A ∩ B| / max(|A|, |B|)   (two capabilities; same formula, other use)
- ``ratio``       |A| / n_units                   (NeuronSet: |A| / (L * d_mlp))
- ``param_share`` params(A) / n_params
- ``consistency`` over N_1..N_n: CS1 = |∩_i N_i| / |∪_i N_i|, CS2 = mean_{i<j} J(N_i, N_j)
- ``ipp``         IPP = m(located) - max_r m(random_r)  (higher_is_better=True), or
                  min_r m(random_r) - m(located)        (higher_is_better=False); positive = better.
                  For erasure either pass the accuracy *drops* with higher_is_better=True, or the
                  accuracies after erasure with higher_is_better=False.
- ``chance``      the exact expected overlap / IoU / cohesion / separability of two random sets of
                  the same sizes (hypergeometric) and the p-value of the observed intersection;
                  ``bootstrap_ci`` a percentile interval (:mod:`capinterp.units.chance`).
- ``overlap_matrix`` the annotated heatmap of ``pairwise(sets, metric)`` (plotly).
- ``otsu_threshold`` Otsu's split of a 1-D sample (e.g. consistency scores into K_I / K_II).

Empty-set conventions:

- two empty sets are identical: overlap = iou = cohesion = separability = 1.0;
- one empty and one non-empty set: all four are 0.0;
- consistency: all sets empty -> (1.0, 1.0); a single set -> (1.0, 1.0); no sets -> ValueError;
- ``mean_pairwise`` needs at least two sets (ValueError); ``ipp`` needs at least one random draw;
- ``otsu_threshold`` of an empty sample -> ValueError; of a constant sample -> that constant.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import torch
from jaxtyping import Float
from torch import Tensor

from capinterp.plots.matrix import pairwise_heatmap
from capinterp.units.base import UnitSet
from capinterp.units.chance import Chance, bootstrap_ci, chance, chance_stats
from capinterp.units.counts import SetLike, keys_of, neuron_mask, set_counts

__all__ = [
    "SET_METRICS",
    "Chance",
    "bootstrap_ci",
    "chance",
    "chance_stats",
    "cohesion",
    "consistency",
    "intersection_size",
    "iou",
    "ipp",
    "mean_pairwise",
    "otsu_threshold",
    "overlap",
    "overlap_matrix",
    "pairwise",
    "param_share",
    "ratio",
    "separability",
]

# Named sets: any hashable key (Mapping is invariant in its key type, so not Mapping[Hashable, ...]).
NamedSets = Mapping[Any, SetLike] | Sequence[SetLike]


def intersection_size(a: SetLike, b: SetLike, *, across_models: bool = False) -> int:
    """|A ∩ B|."""
    return set_counts(a, b, across_models)[0]


def _ratio_of(inter: int, denom: int, na: int, nb: int) -> float:
    if na == 0 and nb == 0:
        return 1.0
    return inter / denom if denom else 0.0


def overlap(a: SetLike, b: SetLike, *, across_models: bool = False) -> float:
    """Overlap coefficient |A ∩ B| / min(|A|, |B|)."""
    i, na, nb = set_counts(a, b, across_models)
    return _ratio_of(i, min(na, nb), na, nb)


def iou(a: SetLike, b: SetLike, *, across_models: bool = False) -> float:
    """Jaccard index |A ∩ B| / |A ∪ B|."""
    i, na, nb = set_counts(a, b, across_models)
    return _ratio_of(i, na + nb - i, na, nb)


def cohesion(a: SetLike, b: SetLike, *, across_models: bool = False) -> float:
    """|A ∩ B| / max(|A|, |B|) for one capability located from two datasets (e.g. EN vs CH)."""
    i, na, nb = set_counts(a, b, across_models)
    return _ratio_of(i, max(na, nb), na, nb)


def separability(a: SetLike, b: SetLike, *, across_models: bool = False) -> float:
    """|A ∩ B| / max(|A|, |B|) for two different capabilities (low = well separated)."""
    return cohesion(a, b, across_models=across_models)


def ratio(a: UnitSet) -> float:
    """|A| / n_units, the share of all units of the space (NeuronSet: |A| / (L * d_mlp))."""
    if not isinstance(a, UnitSet):
        raise TypeError(f"ratio needs a UnitSet that knows its universe, got {type(a).__name__}")
    return a.ratio


def param_share(a: UnitSet) -> float:
    """params(A) / n_params, the share of the model's parameters the units own."""
    if not isinstance(a, UnitSet):
        raise TypeError(f"param_share needs a UnitSet with parameter counts, got {type(a).__name__}")
    return a.param_share


SET_METRICS: dict[str, Callable[..., float]] = {
    "overlap": overlap,
    "iou": iou,
    "cohesion": cohesion,
    "separability": separability,
    "intersection": intersection_size,
}

Metric = str | Callable[[SetLike, SetLike], float]


def _metric_fn(metric: Metric, across_models: bool = False) -> Callable[[SetLike, SetLike], float]:
    if callable(metric):
        return metric
    try:
        fn = SET_METRICS[metric]
        return functools.partial(fn, across_models=True) if across_models else fn
    except (KeyError, TypeError):
        raise ValueError(f"unknown metric {metric!r}; choose one of {sorted(SET_METRICS)} or pass a callable") from None


def _named(sets: NamedSets) -> dict[Hashable, SetLike]:
    if isinstance(sets, Mapping):
        return dict(sets)
    return {i: s for i, s in enumerate(sets)}


def pairwise(sets: NamedSets, metric: Metric = "overlap", *, across_models: bool = False) -> pd.DataFrame:
    """Square DataFrame M[i, j] = metric(set_i, set_j), indexed by the dict keys (or positions)."""
    named = _named(sets)
    fn = _metric_fn(metric, across_models)
    names = list(named)
    vals = [[float(fn(named[r], named[c])) for c in names] for r in names]
    return pd.DataFrame(vals, index=names, columns=names)


def overlap_matrix(sets: NamedSets, metric: Metric = "overlap", title: str | None = None) -> go.Figure:
    """Annotated square heatmap of ``pairwise(sets, metric)``; hover adds the set sizes."""
    named = _named(sets)
    keys = list(named)
    names = [str(k) for k in keys]
    z = pairwise(named, metric).to_numpy(dtype=float)
    label = metric if isinstance(metric, str) else getattr(metric, "__name__", "metric")
    hover = [
        [
            f"{names[r]} vs {names[c]}: {label} {z[r, c]:.3f} "
            f"(|A∩B|={intersection_size(named[keys[r]], named[keys[c]])}, "
            f"|A|={len(named[keys[r]])}, |B|={len(named[keys[c]])})"
            for c in range(len(keys))
        ]
        for r in range(len(keys))
    ]
    bounded = isinstance(metric, str) and metric in SET_METRICS and metric != "intersection"
    return pairwise_heatmap(z, names, hover, label, unit_range=bounded, title=title)


def mean_pairwise(sets: NamedSets, metric: Metric = "overlap", *, across_models: bool = False) -> float:
    """Mean of metric(set_i, set_j) over unordered pairs i < j (needs at least two sets)."""
    items = list(_named(sets).values())
    if len(items) < 2:
        raise ValueError(f"mean_pairwise needs at least two sets, got {len(items)}")
    fn = _metric_fn(metric, across_models)
    return float(np.mean([fn(a, b) for a, b in itertools.combinations(items, 2)]))


def consistency(sets: NamedSets, *, across_models: bool = False) -> tuple[float, float]:
    """(CS1, CS2): CS1 = |∩_i N_i| / |∪_i N_i| (strict); CS2 = mean pairwise Jaccard (relaxed)."""
    items = list(_named(sets).values())
    if not items:
        raise ValueError("consistency needs at least one set")
    for s in items[1:]:
        set_counts(items[0], s, across_models)  # raises on mismatched kinds / spaces
    if len(items) == 1:
        return 1.0, 1.0
    masks = [m for m in map(neuron_mask, items) if m is not None]
    if len(masks) == len(items):
        stack = torch.stack(masks)
        n_inter, n_union = int(stack.all(dim=0).sum()), int(stack.any(dim=0).sum())
    else:
        keys = [keys_of(s) for s in items]
        n_inter, n_union = len(frozenset.intersection(*keys)), len(frozenset.union(*keys))
    cs1 = n_inter / n_union if n_union else 1.0
    return cs1, mean_pairwise(items, "iou", across_models=across_models)


def ipp(located_metric: float, random_metrics: Iterable[float], higher_is_better: bool = True) -> float:
    """Improvement over the best random control: m(located) - max_r m(random_r).

    With ``higher_is_better=False`` (e.g. accuracy after erasure): min_r m(random_r) - m(located).
    Either way a positive IPP means the located set beats every random draw.
    """
    r = np.asarray(list(random_metrics), dtype=float)
    if r.size == 0:
        raise ValueError("ipp needs at least one random-control metric")
    loc = float(located_metric)
    return float(loc - r.max()) if higher_is_better else float(r.min() - loc)


def otsu_threshold(values: Sequence[float] | np.ndarray | Float[Tensor, ...], bins: int = 256) -> float:
    """Otsu's threshold t of a 1-D sample: values >= t form the upper class, values < t the lower.

    Histogram the sample into ``bins`` equal bins over [min, max]; for each cut k between bins,
    with class weights w0, w1 and class means mu0, mu1, maximise the between-class variance
    w0 * w1 * (mu0 - mu1)^2. When several adjacent cuts tie (a gap between modes), the threshold is
    the middle of that run of cuts.
    """
    v = np.asarray(values.detach().cpu() if isinstance(values, torch.Tensor) else values, dtype=float).ravel()
    if v.size == 0:
        raise ValueError("otsu_threshold needs a non-empty sample")
    if not np.isfinite(v).all():
        raise ValueError("otsu_threshold got non-finite values")
    lo, hi = float(v.min()), float(v.max())
    if lo == hi:
        return lo
    counts, edges = np.histogram(v, bins=int(bins), range=(lo, hi))
    centers = (edges[:-1] + edges[1:]) / 2
    w0 = np.cumsum(counts)[:-1].astype(float)  # cut after bin k, k = 0..bins-2
    w1 = v.size - w0
    m0 = np.cumsum(counts * centers)[:-1]
    total = float((counts * centers).sum())
    with np.errstate(divide="ignore", invalid="ignore"):
        between = np.where((w0 > 0) & (w1 > 0), w0 * w1 * (m0 / w0 - (total - m0) / w1) ** 2, -1.0)
    best = between.max()
    k = int(np.argmax(between))
    end = k
    while end + 1 < between.size and between[end + 1] >= best * (1 - 1e-9):
        end += 1
    return float((edges[k + 1] + edges[end + 1]) / 2)


def __dir__() -> list[str]:
    """``dir(ci.metrics)`` lists the metrics (``__all__``), not the modules they are built with."""
    return sorted(__all__)
