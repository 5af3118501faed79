"""Completeness of integrated gradients, per layer: how far a rule's sum is from the exact integral.

IG along the straight path from a baseline ``b`` to the clean activation ``a`` of one layer obeys
*completeness* (Sundararajan et al. 2017, Prop. 1): the neurons' attributions sum to
``F(a) - F(b)``, the change of the objective the kernel integrates (for ``positions="answer"``:
the mean over answer tokens of ``p``, exactly :func:`capinterp.kernels.ig.objective_from_logits`).
A quadrature rule only approximates the integral, so

    completeness error = |sum_i IG_i - (F(x) - F(baseline at that layer))| / |F(x) - F(baseline)|

is a free check of its accuracy (it is a lower bound on the error of the scores' sum; an
error there means the scores are off at least that much). ``F(x)`` is the clean row the
kernel already runs, ``F(baseline)`` one extra row per layer in the same batches.

The same violation relative to ``max(|F(x) - F(baseline)|, ||IG||_1)`` instead
(:func:`completeness_error_l1`) is the one the adaptive rule's estimate uses
(:mod:`capinterp.kernels.adaptive`): a lower bound on the relative L1 error of the scores. The two
differ where a layer's scores cancel (``||IG||_1`` far above ``|F(x) - F(baseline)|``): there a
small absolute error of the sum is a large fraction of ``F(x) - F(baseline)`` but not of the scores.

This module turns the kernel's per-example, per-layer records (the ``stats`` of
:func:`capinterp.kernels.ig.ig_scores` and :func:`capinterp.kernels.sequential.sig_scores`)
into JSON metadata and one warning.
"""

from __future__ import annotations

import math
import warnings

import torch

__all__ = [
    "COMPLETENESS_TOL",
    "STAT_KEYS",
    "CompletenessLog",
    "CompletenessWarning",
    "completeness_error",
    "completeness_error_l1",
    "merge_reports",
    "new_stats",
    "warn_report",
    "worst_layers",
]

#: Default tolerance on the relative completeness error before a localizer warns: 5 % of the
#: layer's F(x) - F(baseline) (the papers' right-20 rule misses it by ~3 % on most SmolLM2 layers
#: and by ~15 % at layer 0, issue 30).
COMPLETENESS_TOL = 0.05
#: Per-example, per-layer records a kernel's ``stats`` receives ([n, n_layers] float64, NaN where
#: a layer was not attributed): F at the baseline, the attributions' sum, the completeness error,
#: the quadrature error estimate (adaptive rule, closed form; NaN for a fixed rule), the nodes
#: (gradient rows) per layer and the attributions' L1 norm ``||IG||_1`` (:func:`completeness_error_l1`).
STAT_KEYS = ("f_base", "attr_sum", "completeness", "error_estimate", "nodes", "attr_l1")
_TINY = 1e-30


class CompletenessWarning(RuntimeWarning):
    """IG scores whose completeness error (or adaptive error estimate) exceeds its tolerance."""


def completeness_error(attr_sum: float, f_clean: float, f_base: float) -> float:
    """``|attr_sum - (f_clean - f_base)| / |f_clean - f_base|`` (inf when the change is exactly 0
    and the sum is not)."""
    delta = f_clean - f_base
    err = abs(attr_sum - delta)
    if err == 0.0:
        return 0.0
    return err / abs(delta) if abs(delta) > _TINY else math.inf


def completeness_error_l1(attr_sum: float, attr_l1: float, f_clean: float, f_base: float) -> float:
    """``|attr_sum - (f_clean - f_base)| / max(|f_clean - f_base|, attr_l1)``: the completeness
    violation relative to the larger of the change and the scores' L1 norm (the adaptive rule's
    normalization; at most :func:`completeness_error`)."""
    err = abs(attr_sum - (f_clean - f_base))
    if err == 0.0:
        return 0.0
    return err / max(abs(f_clean - f_base), attr_l1, _TINY)


def new_stats(n: int, n_layers: int) -> dict[str, torch.Tensor]:
    """Empty records: ``f_clean`` [n] and each of :data:`STAT_KEYS` [n, n_layers], all NaN."""
    out = {k: torch.full((n, n_layers), math.nan, dtype=torch.float64) for k in STAT_KEYS}
    out["f_clean"] = torch.full((n,), math.nan, dtype=torch.float64)
    return out


def _floats(t: torch.Tensor) -> list:
    """A list for JSON metadata: NaN (layer not attributed) -> None."""
    return [None if math.isnan(v) else float(v) for v in t.tolist()]


class CompletenessLog:
    """Per-example records of a fit, gathered from kernel ``stats`` dicts; :meth:`report` makes
    the JSON metadata (per layer: max and mean over examples)."""

    def __init__(self, n_layers: int) -> None:
        self.n_layers = n_layers
        self.rows: dict[str, list[torch.Tensor]] = {k: [] for k in (*STAT_KEYS, "f_clean")}

    def add(self, stats: dict) -> None:
        """Append a kernel call's records (``stats`` as filled by ``ig_scores``/``sig_scores``)."""
        if "completeness" not in stats:
            return
        for k in self.rows:
            self.rows[k].append(stats[k].double().reshape(-1, *(() if k == "f_clean" else (self.n_layers,))))

    @property
    def n_examples(self) -> int:
        return sum(len(t) for t in self.rows["f_clean"])

    def stacked(self, key: str) -> torch.Tensor:
        rows = self.rows[key]
        return torch.cat(rows) if rows else torch.zeros(0, self.n_layers, dtype=torch.float64)

    def report(self, *, per_example: bool = False, tol: float = COMPLETENESS_TOL, rule: str = "") -> dict:
        """JSON metadata: per layer ``completeness_max`` / ``completeness_mean`` (over examples),
        ``completeness_l1_max`` (:func:`completeness_error_l1`, the adaptive rule's normalization),
        ``error_estimate_max``, ``nodes_max`` / ``nodes_mean``; with ``per_example`` also the
        ``[n][n_layers]`` completeness errors. Layers never attributed are None."""
        n = self.n_examples
        rep: dict = {"n_examples": n, "tol": float(tol), "rule": rule, "aggregate": "max and mean over examples"}
        if n == 0:
            return rep
        comp = self.stacked("completeness")
        rep["completeness_max"] = _floats(_nanmax(comp))
        rep["completeness_mean"] = _floats(comp.nanmean(0))
        delta = (self.stacked("f_clean")[:, None] - self.stacked("f_base")).abs()
        viol = (self.stacked("attr_sum") - (self.stacked("f_clean")[:, None] - self.stacked("f_base"))).abs()
        scale = torch.maximum(delta, self.stacked("attr_l1")).clamp_min(_TINY)
        rep["completeness_l1_max"] = _floats(_nanmax(torch.where(viol == 0, 0.0, viol / scale)))
        rep["error_estimate_max"] = _floats(_nanmax(self.stacked("error_estimate")))
        nodes = self.stacked("nodes")
        rep["nodes_max"] = _floats(_nanmax(nodes))
        rep["nodes_mean"] = _floats(nodes.nanmean(0))
        if per_example:
            rep["completeness"] = [_floats(r) for r in comp]
        return rep


def _nanmax(t: torch.Tensor) -> torch.Tensor:
    """Max over dim 0 ignoring NaN (all-NaN columns stay NaN)."""
    filled = torch.where(torch.isnan(t), torch.full_like(t, -math.inf), t).max(0).values
    return torch.where(torch.isinf(filled) & (filled < 0), torch.full_like(filled, math.nan), filled)


def worst_layers(report: dict, key: str = "completeness_max", k: int = 3) -> list[tuple[int, float]]:
    """The ``k`` layers with the largest ``report[key]`` (largest first), as (layer, value)."""
    vals = [(l, v) for l, v in enumerate(report.get(key) or []) if v is not None]
    return sorted(vals, key=lambda lv: -lv[1])[:k]


def warn_report(report: dict, tol: float, what: str, *, est_tol: float | None = None, stacklevel: int = 3) -> bool:
    """One :class:`CompletenessWarning` naming the worst layers when a layer's max completeness
    error exceeds ``tol`` or its error estimate exceeds ``est_tol`` (default ``tol``; the adaptive
    rule's ``tol``); returns whether it warned."""
    msgs = []
    for key, label, lim in (
        ("completeness_max", "completeness error", tol),
        ("error_estimate_max", "error estimate", tol if est_tol is None else est_tol),
    ):
        bad = [(l, v) for l, v in worst_layers(report, key, k=len(report.get(key) or [])) if v > lim]
        if bad:
            named = ", ".join(f"layer {l}: {v:.3g}" for l, v in bad[:3])
            more = f" (+{len(bad) - 3} more layers)" if len(bad) > 3 else ""
            msgs.append(f"{label} above {lim:g} on {len(bad)} layer(s), worst {named}{more}")
    if not msgs:
        return False
    warnings.warn(
        f"{what}: IG {'; '.join(msgs)} (max over {report.get('n_examples', '?')} example(s)); "
        "the scores there are at least that far from the exact integral: use rule='adaptive' or more steps",
        CompletenessWarning,
        stacklevel=stacklevel,
    )
    return True


def merge_reports(reports: list[dict]) -> dict:
    """One report from several (:meth:`CompletenessLog.report` outputs, e.g. one per fact): per
    layer the max of the maxima and the example-weighted mean of the means."""
    reports = [r for r in reports if r and r.get("n_examples")]
    if not reports:
        return {}
    n = sum(r["n_examples"] for r in reports)
    out: dict = {k: reports[0][k] for k in ("tol", "rule", "aggregate") if k in reports[0]}
    out["n_examples"] = n
    for key in ("completeness_max", "completeness_l1_max", "error_estimate_max", "nodes_max"):
        if not all(key in r for r in reports):
            continue
        cols = list(zip(*(r[key] for r in reports)))
        out[key] = [None if all(v is None for v in c) else max(v for v in c if v is not None) for c in cols]
    for key in ("completeness_mean", "nodes_mean"):
        cols = list(zip(*([(v, r["n_examples"]) for v in r[key]] for r in reports)))
        out[key] = [
            None
            if all(v is None for v, _ in c)
            else sum(v * w for v, w in c if v is not None) / sum(w for v, w in c if v is not None)
            for c in cols
        ]
    return out
