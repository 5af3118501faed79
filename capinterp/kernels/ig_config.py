"""The settings of an integrated-gradients computation, in one frozen value: :class:`IGConfig`.

The IG kernels (:func:`capinterp.kernels.ig.ig_scores`, :func:`capinterp.kernels.sequential.sig_scores`)
take one ``config``; the IG localizers (KN, CNL, SIG, AMIG) keep their scikit-learn style keyword
arguments and build one in ``fit``. What varies per call and is data rather than a setting (the
examples, a baseline tensor, the layers, a ``stats`` dict, a progress bar) stays a call argument.

Named presets:

* :data:`PAPERS`: the papers' computation (Dai et al. 2022 Sec. 3.1, Huang et al. 2025 Eq. 7):
  the right Riemann sum with 20 points, integrated node by node;
* :data:`CLOSED_FORM`: the same rule, summed in closed form from four nodes on models whose FFN
  output is scale invariant (Gemma 2/3; :mod:`capinterp.kernels.invariant`) and node by node
  elsewhere; the library's default (``IGConfig()``);
* :data:`GAUSS_LEGENDRE`: Gauss-Legendre with :data:`~capinterp.kernels.quadrature.ACCURATE_STEPS`
  (10) points, float32-exact where the papers' 20 are not (``ig_preset("accurate", ...)``);
* :data:`ADAPTIVE`: Gauss-Legendre nodes doubled per layer until the error estimate is below
  ``tol`` (:mod:`capinterp.kernels.adaptive`).

Vocabulary (docs/architecture.md): ``rule`` is the quadrature rule, ``route`` the way the rows
run through the model (``"fast"``, ``"prefix"``, ``"loop"``: same numbers, different cost).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from capinterp.kernels.completeness import COMPLETENESS_TOL
from capinterp.kernels.quadrature import (
    ACCURATE_STEPS,
    ADAPTIVE_MAX_STEPS,
    ADAPTIVE_RULE,
    ADAPTIVE_TOL,
    RULES,
    check_rule,
)

__all__ = [
    "ADAPTIVE",
    "CLOSED_FORM",
    "GAUSS_LEGENDRE",
    "INVARIANCE",
    "OBJECTIVES",
    "PAPERS",
    "POSITIONS",
    "ROUTES",
    "IGConfig",
]

#: Scaled positions: ``"answer"`` (every answer-predicting position, CNL), ``"last_prompt"``
#: (the last prompt token, KN) and ``"prompt"`` (every prompt token after the BOS, one at a time: SIG).
POSITIONS = ("answer", "last_prompt", "prompt")
OBJECTIVES = ("prob", "logprob")
#: How the rows run: the prefix-reusing layer staircase, the prefix reuse through the bridge's
#: own forward, or full sequences (the straightforward reference).
ROUTES = ("fast", "prefix", "loop")
INVARIANCE = ("auto", "off")


def _choice(name: str, value: object, allowed: tuple[str, ...]) -> None:
    if not isinstance(value, str) or value not in allowed:
        raise ValueError(f"unknown {name} {value!r}; choose one of {', '.join(allowed)}")


def _positive_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")


def _positive_float(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")


@dataclass(frozen=True)
class IGConfig:
    """The settings of one IG computation; validated on construction (ValueError naming the field).

    Args:
        steps: quadrature points m per layer (rows per layer); unused by the adaptive rule.
        rule: quadrature rule, one of :data:`capinterp.kernels.quadrature.RULES` or ``"adaptive"``.
        positions: the scaled positions (:data:`POSITIONS`; ``ig_scores`` takes ``"answer"`` and
            ``"last_prompt"``, ``sig_scores`` ``"prompt"`` and ``"last_prompt"``).
        objective: ``"prob"`` or ``"logprob"`` of the answer tokens.
        route: ``"fast"``, ``"prefix"`` or ``"loop"`` (:data:`ROUTES`; same numbers, different cost).
        invariance: ``"auto"`` sums the rule in closed form on scale-invariant models, ``"off"`` never.
        batch_size: rows per forward and backward; bounds peak memory.
        tol: the adaptive rule's tolerance on each layer's error estimate.
        max_steps: the adaptive rule's node cap per layer.
        completeness_tol: None (default): no tolerance asked, the localizers report each layer's
            completeness error (``meta_["ig_check"]``) and do not warn; a number > 0: they also
            warn (:class:`~capinterp.kernels.completeness.CompletenessWarning`) when a layer's
            completeness error exceeds it on some example.
    """

    steps: int = 20
    rule: str = "right"
    positions: str = "answer"
    objective: str = "prob"
    route: str = "fast"
    invariance: str = "auto"
    batch_size: int = 64
    tol: float = ADAPTIVE_TOL
    max_steps: int = ADAPTIVE_MAX_STEPS
    completeness_tol: float | None = COMPLETENESS_TOL

    def __post_init__(self) -> None:
        _positive_int("steps", self.steps)
        _choice("rule", self.rule, (*RULES, ADAPTIVE_RULE))
        check_rule(self.steps, self.rule, adaptive=True)  # a rule's own minimum of steps
        _choice("positions", self.positions, POSITIONS)
        _choice("objective", self.objective, OBJECTIVES)
        _choice("route", self.route, ROUTES)
        _choice("invariance", self.invariance, INVARIANCE)
        _positive_int("batch_size", self.batch_size)
        _positive_float("tol", self.tol)
        _positive_int("max_steps", self.max_steps)
        tol = self.completeness_tol  # None: no tolerance asked (report only)
        if tol is not None and (
            isinstance(tol, bool) or not isinstance(tol, (int, float)) or not math.isfinite(tol) or tol <= 0
        ):
            raise ValueError(
                f"completeness_tol must be a finite number > 0, or None (no tolerance asked: report only), got {tol!r}"
            )

    @property
    def adaptive(self) -> bool:
        """Whether the rule is the adaptive one (``steps`` then unused)."""
        return self.rule == ADAPTIVE_RULE

    def replace(self, **changes: object) -> IGConfig:
        """A copy with ``changes`` (validated again)."""
        return replace(self, **changes)  # type: ignore[arg-type]


#: The papers' computation: right Riemann sum, 20 points, integrated node by node.
PAPERS = IGConfig(steps=20, rule="right", invariance="off")
#: The papers' rule summed in closed form on scale-invariant models (the library's default).
CLOSED_FORM = IGConfig(steps=20, rule="right", invariance="auto")
#: Gauss-Legendre with 10 points: float32-exact on SmolLM2 where the papers' 20 are not.
GAUSS_LEGENDRE = IGConfig(steps=ACCURATE_STEPS, rule="gauss")
#: Per layer, Gauss-Legendre nodes doubled until the error estimate is <= ``tol``.
ADAPTIVE = IGConfig(rule=ADAPTIVE_RULE)
