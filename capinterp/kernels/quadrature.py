"""Quadrature rules for integrals along a straight path, ``int_0^1 f(alpha) d alpha ~ sum_k w_k f(alpha_k)``.

Integrated gradients (Sundararajan et al. 2017, section 3) is such an integral; the papers
(Dai et al. 2022 section 3.1, and the capability-neuron papers after it) use the right
Riemann sum with m = 20 points, whose error falls only as 1/m. Gauss-Legendre with m points
is exact for polynomials of degree 2m - 1 and its error falls exponentially in m for the
smooth (analytic) paths of a transformer; the midpoint and trapezoid rules fall as 1/m^2.

Rules (``steps`` = m = number of evaluation points, i.e. forward/backward rows per layer):

* ``"right"``: alpha_k = k/m, w_k = 1/m (the papers' rule);
* ``"left"``: alpha_k = (k-1)/m, w_k = 1/m;
* ``"linspace"``: alpha_k = (k-1)/(m-1), w_k = 1/m (EleutherAI's KN port; biased, kept for parity);
* ``"midpoint"``: alpha_k = (k-1/2)/m, w_k = 1/m;
* ``"trapezoid"``: alpha_k = (k-1)/(m-1), w_k = 1/(m-1), halved at both ends (m >= 2);
* ``"gauss"``: Gauss-Legendre nodes and weights of [-1, 1] mapped to [0, 1].

``"adaptive"`` (:data:`ADAPTIVE_RULE`) is not a fixed rule: the IG kernel refines a graded rule
(:func:`graded`: composite Gauss-Legendre on panels shrinking geometrically towards alpha = 0) per
layer until an error estimate is below a tolerance (:mod:`capinterp.kernels.adaptive`);
:func:`check_rule` accepts it where a caller allows it, :func:`quadrature` does not.
"""

from __future__ import annotations

import itertools

import numpy as np
import torch
from jaxtyping import Float64

__all__ = [
    "ACCURATE_STEPS",
    "ADAPTIVE_MAX_STEPS",
    "ADAPTIVE_RULE",
    "ADAPTIVE_TOL",
    "IG_RULES",
    "RULES",
    "check_rule",
    "graded",
    "ig_preset",
    "quadrature",
]

RULES = ("right", "left", "linspace", "midpoint", "trapezoid", "gauss")
_MIN_STEPS = {"linspace": 2, "trapezoid": 2}
#: The adaptive rule's name, its default tolerance and node cap (per layer).
ADAPTIVE_RULE = "adaptive"
ADAPTIVE_TOL = 1e-3
ADAPTIVE_MAX_STEPS = 256  # SmolLM2's layer 0 needs 256 on one of the 10 benchmark prompts (docs/results.md)


def check_rule(steps: int, rule: str, *, adaptive: bool = False) -> None:
    """ValueError naming the argument when ``rule``/``steps`` are not a valid pair
    (``adaptive=True``: ``"adaptive"`` is accepted too)."""
    allowed = (*RULES, ADAPTIVE_RULE) if adaptive else RULES
    if rule not in allowed:
        raise ValueError(f"rule must be one of {allowed}, got {rule!r}")
    low = _MIN_STEPS.get(rule, 1)
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < low:
        raise ValueError(f"steps must be an integer >= {low} for rule {rule!r}, got {steps!r}")


def quadrature(steps: int, rule: str = "right") -> tuple[Float64[torch.Tensor, " m"], Float64[torch.Tensor, " m"]]:
    """(nodes alpha_k in [0, 1], weights w_k), float64 on the CPU; the weights sum to 1."""
    check_rule(steps, rule)
    m = steps
    k = torch.arange(1, m + 1, dtype=torch.float64)
    w = torch.full((m,), 1.0 / m, dtype=torch.float64)
    if rule == "right":
        return k / m, w
    if rule == "left":
        return (k - 1) / m, w
    if rule == "midpoint":
        return (k - 0.5) / m, w
    if rule == "linspace":
        return (k - 1) / (m - 1), w
    if rule == "trapezoid":
        w = torch.full((m,), 1.0 / (m - 1), dtype=torch.float64)
        w[0] = w[-1] = 0.5 / (m - 1)
        return (k - 1) / (m - 1), w
    x, wx = np.polynomial.legendre.leggauss(m)
    return torch.from_numpy((x + 1) / 2), torch.from_numpy(wx / 2)


#: Ratio of consecutive panel edges of :func:`graded`.
GRADED_RATIO = 0.25


def graded(
    levels: int, per_level: int, ratio: float = GRADED_RATIO, growth: int = 0
) -> tuple[Float64[torch.Tensor, " m"], Float64[torch.Tensor, " m"]]:
    """Composite Gauss-Legendre graded towards alpha = 0: (nodes, weights), float64 on the CPU.

    Panels ``[0, r^K], [r^K, r^(K-1)], ..., [r, 1]`` (``r = ratio``, ``K = levels``); the ``i``-th
    from the bottom (``i = 0 .. K``) gets ``per_level + growth * i`` Gauss-Legendre nodes. Nodes in
    increasing order, exact for polynomials of degree ``2 per_level - 1``; ``levels=0`` is
    :func:`quadrature` ``"gauss"``. Made for integrands with a sharp feature of width ``c`` at 0,
    ``h(alpha) / alpha`` with ``h -> 0`` below ``c`` and nearly constant above, or a bump there
    (zero-baseline IG on Gemma 2/3 per neuron and summed, where the post-FFN RMSNorm makes the
    layer's output scale invariant down to its ``eps``, :mod:`capinterp.kernels.invariant`): on each panel ``[r x, x]``
    such an integrand is as smooth relative to the panel's width whatever ``x`` is, and once
    ``r^K << c`` the bottom panel is smooth too. ``growth > 0`` gives the wider panels above more nodes (the hp rule of
    Schwab's p/hp finite elements: degree growing linearly away from the singularity), for an
    integrand that also varies on the scale of the whole path.
    """
    if isinstance(levels, bool) or not isinstance(levels, int) or levels < 0:
        raise ValueError(f"levels must be an integer >= 0, got {levels!r}")
    if isinstance(per_level, bool) or not isinstance(per_level, int) or per_level < 1:
        raise ValueError(f"per_level must be an integer >= 1, got {per_level!r}")
    if not 0.0 < ratio < 1.0:
        raise ValueError(f"ratio must be in (0, 1), got {ratio!r}")
    if isinstance(growth, bool) or not isinstance(growth, int) or growth < 0:
        raise ValueError(f"growth must be an integer >= 0, got {growth!r}")
    edges = [0.0] + [ratio**j for j in range(levels, -1, -1)]
    nodes, weights = [], []
    for i, (a, b) in enumerate(itertools.pairwise(edges)):
        x, wx = np.polynomial.legendre.leggauss(per_level + growth * i)
        nodes.append(a + (b - a) * (x + 1) / 2)
        weights.append((b - a) * wx / 2)
    return torch.from_numpy(np.concatenate(nodes)), torch.from_numpy(np.concatenate(weights))


IG_RULES = {
    "papers": "right Riemann sum, the papers' steps (Dai et al. 2022 section 3.1)",
    "accurate": "Gauss-Legendre, at most 10 points (ACCURATE_STEPS)",
}
#: 10 points: float32-exact on SmolLM2 layers 1-29, where 5 leave up to 1e-2 (docs/results.md,
#: "Quadrature rules"); still half the papers' 20 rows.
ACCURATE_STEPS = 10


def ig_preset(name: str, steps: int) -> dict:
    """``{"rule", "steps"}`` for a named choice: ``"papers"`` keeps ``steps`` on the right Riemann
    rule; ``"accurate"`` uses Gauss-Legendre with ``min(steps, ACCURATE_STEPS)`` points (the
    localizer keyword arguments of the experiments' ``ig_rule``; at 20 steps they are the rule and
    steps of :data:`capinterp.kernels.ig_config.PAPERS` and :data:`~capinterp.kernels.ig_config.GAUSS_LEGENDRE`)."""
    if name not in IG_RULES:
        raise ValueError(f"ig_rule must be one of {tuple(IG_RULES)}, got {name!r}")
    if name == "papers":
        return {"rule": "right", "steps": int(steps)}
    return {"rule": "gauss", "steps": min(int(steps), ACCURATE_STEPS)}
