"""One line about a result's IG completeness report (``meta["ig_check"]``), for reprs and logs.

Pure functions of the report dict that :mod:`capinterp.kernels.completeness` writes, kept in the
units layer so that result types (:class:`~capinterp.units.neuron_set.NeuronSet`,
:class:`~capinterp.units.neuron_scores.NeuronScores`) can show it without importing a kernel.
"""

from __future__ import annotations

__all__ = ["PAPERS_RULE", "report_line", "rule_label", "worst_layers"]

#: The papers' fixed rule, ``(rule, steps)``: the right Riemann sum with 20 points (Dai et al. 2022,
#: "Knowledge Neurons in Pretrained Transformers", arXiv 2104.08696, Sec. 3.1; Huang et al. 2025,
#: "Capabilities Can be Localized rather than Individual Knowledge", arXiv 2502.20992, Eq. 7).
PAPERS_RULE = ("right", 20)


def worst_layers(report: dict, key: str = "completeness_max", k: int = 3) -> list[tuple[int, float]]:
    """The ``k`` layers with the largest ``report[key]`` (largest first), as (layer, value)."""
    vals = [(l, v) for l, v in enumerate(report.get(key) or []) if v is not None]
    return sorted(vals, key=lambda lv: -lv[1])[:k]


def rule_label(report: dict) -> str:
    """``IG rule right:20 (the papers' approximation)``, ``IG rule gauss:10``, ``IG rule adaptive (tol=0.001)``."""
    rule = report.get("rule") or "?"
    if rule == "adaptive":
        return f"IG rule adaptive (tol={report.get('adaptive_tol')})"
    label = f"IG rule {rule}:{report.get('steps')}"
    return label + (" (the papers' approximation)" if (rule, report.get("steps")) == PAPERS_RULE else "")


def report_line(report: dict | None) -> str:
    """One line for a result's repr or a log: the rule, the worst layer's completeness error and the
    verdict on the accuracy asked (``IG rule right:20 (the papers' approximation): completeness
    error max 0.286 at layer 9 over 40 examples, no tolerance asked``); "" without a report."""
    if not report or not report.get("n_examples"):
        return ""
    worst = worst_layers(report, k=1)
    err = f"completeness error max {worst[0][1]:.3g} at layer {worst[0][0]}" if worst else "no layer attributed"
    verdict = {None: "no tolerance asked", True: "within the tolerance asked", False: "OVER the tolerance asked"}
    return f"{rule_label(report)}: {err} over {report['n_examples']} examples, {verdict[report.get('within_tol')]}"
