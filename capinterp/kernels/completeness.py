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
into JSON metadata (the report) and, where an accuracy was asked for and missed, one warning.

Policy (what is information and what is an alarm):

* the default, the papers' fixed rule (right Riemann sum, 20 points; :data:`PAPERS_RULE`), is an
  approximation of the integral by design; its completeness error is *reported* (the report's
  ``approximation`` names it, ``completeness_max`` measures it), never warned about;
* a :class:`CompletenessWarning` fires only where the user asked for an accuracy and did not get
  it: an explicit ``completeness_tol=`` that a layer's completeness error exceeds, or
  ``rule="adaptive"`` whose ``tol=`` a layer's error estimate still exceeds at ``max_steps``.
  It is a warning, not an error, so that a long fit's scores are kept; make it an error with
  ``warnings.simplefilter("error", CompletenessWarning)``. The report's ``within_tol`` (None where
  nothing was asked) and ``over_tol`` record the same verdict.
"""

from __future__ import annotations

import math
import warnings

import torch

from capinterp.units.ig_report import PAPERS_RULE, report_line, rule_label, worst_layers

__all__ = [
    "COMPLETENESS_TOL",
    "PAPERS_RULE",
    "STAT_KEYS",
    "CompletenessLog",
    "CompletenessWarning",
    "completeness_error",
    "completeness_error_l1",
    "describe_rule",
    "judge",
    "merge_reports",
    "new_stats",
    "report_line",
    "rule_label",
    "warn_report",
    "worst_layers",
]

#: Default ``completeness_tol`` of the IG localizers: None, no tolerance asked. The completeness
#: error is recorded in the report either way; only a tolerance the user passes can warn (the
#: papers' right-20 rule misses completeness by ~3 % on most SmolLM2 layers and ~15 % at layer 0,
#: by design: it is their approximation, reported as such).
COMPLETENESS_TOL: float | None = None
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


def describe_rule(rule: str, steps: int | None, adaptive_tol: float | None = None) -> str:
    """What the report's numbers come from, in words: the papers' approximation, another fixed rule,
    or the adaptive rule with its tolerance."""
    if rule == "adaptive":
        tol = "tol" if adaptive_tol is None else f"tol={adaptive_tol:g}"
        return (
            f"adaptive rule: each layer's nodes refined until its error estimate is <= {tol} "
            "(a layer that reaches max_steps first is over tol and named in a CompletenessWarning)"
        )
    what = "a fixed rule" if (rule, steps) != PAPERS_RULE else "the papers' fixed rule"
    paper = " (Dai et al. 2022; Huang et al. 2025)" if (rule, steps) == PAPERS_RULE else ""
    return (
        f"{what} {rule}:{steps}{paper}, an approximation of the IG integral: completeness_max is, per layer, "
        "how far the scores' sum is from F(x) - F(baseline) (information, not an error); for a bounded "
        "error use rule='adaptive' with tol=, or pass completeness_tol= to be warned above it"
    )


class CompletenessLog:
    """Per-example records of a fit, gathered from kernel ``stats`` dicts; :meth:`report` makes
    the JSON metadata (per layer: max and mean over examples). :meth:`tensors` / :meth:`extend`
    carry the records through a checkpoint or between ranks (float64, exact)."""

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
        if rows:
            return torch.cat(rows)
        return torch.zeros(0, *(() if key == "f_clean" else (self.n_layers,)), dtype=torch.float64)

    def tensors(self, start: int = 0) -> dict[str, torch.Tensor]:
        """The records of examples ``start:`` (in the order added), one float64 tensor per key."""
        return {k: self.stacked(k)[start:].clone() for k in self.rows}

    def extend(self, tensors: dict[str, torch.Tensor]) -> None:
        """Append records from :meth:`tensors` (a checkpoint, another rank)."""
        missing = set(self.rows) - set(tensors)
        if missing:
            raise ValueError(f"completeness records lack {sorted(missing)}")
        self.add(dict(tensors))

    def reorder(self, order: torch.Tensor | list[int]) -> None:
        """Keep the records in ``order`` (positions into the current rows; e.g. sorted by example index)."""
        idx = torch.as_tensor(order, dtype=torch.long)
        self.rows = {k: [self.stacked(k)[idx]] for k in self.rows}

    def report(
        self,
        *,
        per_example: bool = False,
        rule: str = "",
        steps: int | None = None,
        completeness_tol: float | None = None,
        adaptive_tol: float | None = None,
    ) -> dict:
        """JSON metadata: the rule (``rule``, ``steps``, in words ``approximation``), what accuracy
        was asked (``completeness_tol``; ``adaptive_tol`` under ``rule="adaptive"``; None: none) and
        whether it was met (:func:`judge`: ``within_tol``, ``over_tol``); per layer
        ``completeness_max`` / ``completeness_mean`` (over examples), ``completeness_l1_max``
        (:func:`completeness_error_l1`, the adaptive rule's normalization), ``error_estimate_max``,
        ``nodes_max`` / ``nodes_mean``; with ``per_example`` also the ``[n][n_layers]`` completeness
        errors. Layers never attributed are None."""
        n = self.n_examples
        adaptive = rule == "adaptive"
        rep: dict = {
            "n_examples": n,
            "rule": rule,
            "steps": None if adaptive else steps,
            "approximation": describe_rule(rule, steps, adaptive_tol) if rule else "",
            "completeness_tol": None if completeness_tol is None else float(completeness_tol),
            "adaptive_tol": float(adaptive_tol) if adaptive and adaptive_tol is not None else None,
            "aggregate": "max and mean over examples",
        }
        if n == 0:
            return judge(rep)
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
        return judge(rep)


def _nanmax(t: torch.Tensor) -> torch.Tensor:
    """Max over dim 0 ignoring NaN (all-NaN columns stay NaN)."""
    filled = torch.where(torch.isnan(t), torch.full_like(t, -math.inf), t).max(0).values
    return torch.where(torch.isinf(filled) & (filled < 0), torch.full_like(filled, math.nan), filled)


def _limits(report: dict) -> list[tuple[str, str, str, float]]:
    """(key of the report, its label, the setting, the limit) for every accuracy that was asked."""
    out = []
    if report.get("completeness_tol") is not None:
        out.append(("completeness_max", "completeness error", "completeness_tol", float(report["completeness_tol"])))
    if report.get("adaptive_tol") is not None:
        out.append(("error_estimate_max", "error estimate", "tol (rule='adaptive')", float(report["adaptive_tol"])))
    return out


def judge(report: dict) -> dict:
    """``report`` with the verdict on the accuracy asked for: ``over_tol`` (per asked setting, the
    layers above its limit, worst first) and ``within_tol`` (True / False; None where nothing was
    asked, the default: the numbers are then information only)."""
    limits = _limits(report)
    over: dict[str, list[int]] = {}
    for key, _, setting, lim in limits:
        over[setting] = [l for l, v in worst_layers(report, key, k=len(report.get(key) or [])) if v > lim]
    report["over_tol"] = over
    report["within_tol"] = None if not limits else not any(over.values())
    return report


def warn_report(report: dict, what: str, *, stacklevel: int = 3) -> bool:
    """One :class:`CompletenessWarning` when the accuracy the user asked for (the report's
    ``completeness_tol``, or ``adaptive_tol`` under ``rule="adaptive"``) was missed on some layer,
    naming the worst layers; nothing when none was asked. Returns whether it warned."""
    if judge(report)["within_tol"] is not False:
        return False
    msgs = []
    for key, label, setting, lim in _limits(report):
        bad = [(l, v) for l, v in worst_layers(report, key, k=len(report.get(key) or [])) if v > lim]
        if bad:
            named = ", ".join(f"layer {l}: {v:.3g}" for l, v in bad[:3])
            more = f" (+{len(bad) - 3} more layers)" if len(bad) > 3 else ""
            msgs.append(f"{label} above {setting}={lim:g} on {len(bad)} layer(s), worst {named}{more}")
    if report.get("adaptive_tol") is not None:
        fix = "raise max_steps (the adaptive rule stopped at its node cap) or loosen tol"
    else:
        fix = "use rule='adaptive' with tol=, more steps, or rule='gauss'"
    warnings.warn(
        f"{what}: IG {'; '.join(msgs)} (max over {report.get('n_examples', '?')} example(s)); "
        f"the scores there are at least that far from the exact integral: {fix}",
        CompletenessWarning,
        stacklevel=stacklevel,
    )
    return True


_SETTINGS = ("rule", "steps", "approximation", "completeness_tol", "adaptive_tol", "aggregate")


def merge_reports(reports: list[dict]) -> dict:
    """One report from several (:meth:`CompletenessLog.report` outputs, e.g. one per fact, in a
    fixed order): per layer the max of the maxima and the example-weighted mean of the means; the
    settings of the first, judged again."""
    reports = [r for r in reports if r and r.get("n_examples")]
    if not reports:
        return {}
    n = sum(r["n_examples"] for r in reports)
    out: dict = {k: reports[0][k] for k in _SETTINGS if k in reports[0]}
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
    return judge(out)
