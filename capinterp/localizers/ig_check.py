"""Per-layer completeness of an IG-based localizer's fit: recorded in ``meta_["ig_check"]``,
shown by :meth:`IGChecked.summary`; a warning only where an accuracy was asked for and missed.

The kernels (:func:`capinterp.kernels.ig.ig_scores`, :func:`capinterp.kernels.sequential.sig_scores`)
fill a ``stats`` dict per call; the localizer gathers them in a
:class:`~capinterp.kernels.completeness.CompletenessLog` during ``fit`` and writes its report
(per layer: max and mean over the fit's examples; the rule, named as the papers' approximation
where it is theirs; the tolerance asked, if any, and whether it was met) into the result metadata,
which ``NeuronScores``/``NeuronSet`` carry through save/load. The policy (report by default, warn
only on a missed ``completeness_tol=`` or adaptive ``tol=``) is :mod:`capinterp.kernels.completeness`'s.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Any, ClassVar

import pandas as pd

from capinterp.arch.model import neuron_shape
from capinterp.core import validate
from capinterp.core.constraints import Interval, Options
from capinterp.core.protocol import Model
from capinterp.kernels.completeness import (
    COMPLETENESS_TOL,
    CompletenessLog,
    CompletenessWarning,
    report_line,
    rule_label,
    warn_report,
)
from capinterp.kernels.ig_config import INVARIANCE, OBJECTIVES, ROUTES, IGConfig
from capinterp.kernels.quadrature import ADAPTIVE_MAX_STEPS, ADAPTIVE_RULE, ADAPTIVE_TOL, RULES

__all__ = [
    "COMPLETENESS_TOL",
    "IG_PARAMETER_CONSTRAINTS",
    "IGChecked",
    "ig_check_frame",
    "ig_check_line",
    "quiet_kernel_warnings",
]


def ig_check_frame(report: dict) -> pd.DataFrame:
    """One row per layer: completeness error (max, mean over examples; max relative to
    max(|F(x) - F(baseline)|, ||IG||_1)), error estimate, nodes."""
    cols = {
        "completeness_max": "completeness_max",
        "completeness_mean": "completeness_mean",
        "completeness_l1_max": "completeness_l1_max",
        "error_estimate_max": "error_estimate_max",
        "nodes_max": "nodes_max",
        "nodes_mean": "nodes_mean",
    }
    data = {name: report.get(key) for name, key in cols.items() if report.get(key) is not None}
    df = pd.DataFrame(data, dtype=float)
    over = {l for layers in (report.get("over_tol") or {}).values() for l in layers}
    if report.get("within_tol") is not None and len(df):
        df["within_tol"] = [l not in over for l in range(len(df))]
    df.index.name = "layer"
    df.columns.name = rule_label(report)
    df.attrs["ig_check"] = {k: v for k, v in report.items() if k != "completeness"}
    return df


#: One line for a result's repr or a log (:func:`capinterp.kernels.completeness.report_line`).
ig_check_line = report_line


#: The IG keyword block of :class:`IGChecked` (the fields of :class:`~capinterp.kernels.ig_config.IGConfig`
#: a localizer takes as keywords; ``positions`` is each localizer's own). Cross-field rules (a
#: rule's minimum of steps, what a kernel can run) stay :class:`IGConfig`'s and the kernels'.
IG_PARAMETER_CONSTRAINTS: dict[str, list[Any]] = {
    "steps": [Interval(int, 1, None)],
    "rule": [Options(*RULES, ADAPTIVE_RULE)],
    "objective": [Options(*OBJECTIVES)],
    "route": [Options(*ROUTES)],
    "invariance": [Options(*INVARIANCE)],
    "tol": [Interval(float, 0, None, closed="neither")],
    "max_steps": [Interval(int, 1, None)],
    "completeness_tol": [Interval(float, 0, None, closed="neither"), None],
}


class IGChecked:
    """Mixin of IG-based localizers (KN, CNL, SIG, AMIG): the IG keyword block, declared once.

    Its constructor takes the IG settings (``steps``, ``rule``, ``objective``, ``route``,
    ``invariance``, ``tol``, ``max_steps``, ``completeness_tol``; constraints:
    :data:`IG_PARAMETER_CONSTRAINTS`), stores them and passes the other keywords on to the next
    class (the :class:`~capinterp.localizers.base.Localizer`); :meth:`_ig_settings` gathers them
    into an :class:`~capinterp.kernels.ig_config.IGConfig`. Call :meth:`_ig_begin` before scoring,
    pass :meth:`_ig_stats` dicts to the kernel, :meth:`_ig_report` when building the metadata and
    :meth:`_ig_warn` at the end of ``fit``."""

    _parameter_constraints: ClassVar[dict[str, list[Any]]] = IG_PARAMETER_CONSTRAINTS

    def __init__(
        self,
        model: Model,
        *,
        steps: int = 20,
        rule: str = "right",
        objective: str = "prob",
        route: str = "fast",
        invariance: str = "auto",
        tol: float = ADAPTIVE_TOL,
        max_steps: int = ADAPTIVE_MAX_STEPS,
        completeness_tol: float | None = COMPLETENESS_TOL,
        **kwargs: Any,
    ) -> None:
        self.steps, self.rule, self.objective, self.route, self.invariance = steps, rule, objective, route, invariance
        self.tol, self.max_steps, self.completeness_tol = tol, max_steps, completeness_tol
        super().__init__(model, **kwargs)  # type: ignore[call-arg]  # the Localizer after this mixin

    steps: int
    rule: str
    objective: str
    route: str
    invariance: str
    tol: float
    max_steps: int
    completeness_tol: float | None
    meta_: dict
    model: Model
    name: str
    #: Whether the report keeps every example's per-layer errors (per-prompt localizers).
    _ig_per_example: bool = True

    def _ig_settings(self, positions: str, batch_size: int) -> IGConfig:
        """The localizer's IG settings as one :class:`~capinterp.kernels.ig_config.IGConfig`
        (validated: ValueError naming a bad one)."""
        keywords = {k: getattr(self, k) for k in IG_PARAMETER_CONSTRAINTS}  # the IG keyword block
        return IGConfig(positions=positions, batch_size=batch_size, **keywords)

    def _ig_begin(self) -> None:
        self._ig_log = CompletenessLog(neuron_shape(validate.model(self.model))[0])

    def _ig_stats(self) -> dict:
        """A fresh ``stats`` dict for one kernel call; recorded by :meth:`_ig_add` after it returns."""
        return {}

    def _ig_add(self, stats: dict) -> None:
        if not hasattr(self, "_ig_log"):
            self._ig_begin()
        self._ig_log.add(stats)

    def _example_log(self) -> CompletenessLog:
        """The fit's per-example records (a dataset-level fit keeps them in its checkpoint and
        gathers them over ranks: :class:`capinterp.localizers.dataset.DatasetNeuronLocalizer`)."""
        if not hasattr(self, "_ig_log"):
            self._ig_begin()
        return self._ig_log

    def _ig_report(self) -> dict:
        return self._example_log().report(
            per_example=self._ig_per_example,
            rule=self.rule,
            steps=self.steps,
            completeness_tol=self.completeness_tol,
            adaptive_tol=getattr(self, "tol", None),
        )

    def _ig_warn(self) -> None:
        """A :class:`CompletenessWarning` only when the fit missed an accuracy the user asked for
        (``completeness_tol=``, or ``tol=`` of the adaptive rule); the default only reports."""
        warn_report(self.meta_.get("ig_check", {}), f"{type(self).__name__}.fit", stacklevel=4)

    def summary(self) -> pd.DataFrame:
        """Per layer: the completeness error ``|sum IG - (F(x) - F(baseline))| / |F(x) - F(baseline)|``
        (max and mean over the fit's examples), the error estimate (adaptive rule, closed form) and
        the nodes used (:mod:`capinterp.kernels.completeness`); ``within_tol`` per layer when a
        tolerance was asked. The header names the rule (the papers' approximation by default); the
        whole report is in ``attrs["ig_check"]``."""
        if not hasattr(self, "meta_"):
            raise RuntimeError(f"{type(self).__name__} is not fitted yet: call .fit(data) first")
        frame = ig_check_frame(self.meta_.get("ig_check", {}))
        if getattr(self, "certificate_", None) is not None:  # capinterp.certify's line, once certified
            frame.attrs["certificate"] = self.certificate_.summary()  # type: ignore[attr-defined]
        return frame


@contextlib.contextmanager
def quiet_kernel_warnings():
    """The kernels' own per-call completeness warnings are dropped; the fit warns once instead
    (only where an accuracy was asked for and missed)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CompletenessWarning)
        yield
