"""Closed-form integrated gradients for layers whose FFN output is scale invariant.

Gemma 2 and Gemma 3 normalize the FFN output before adding it to the residual
(``resid += RMSNorm_post(W_out a)``; no output bias). Scaling a layer's whole ``hook_post``
vector by ``alpha > 0`` then leaves the model's output unchanged, ``F(alpha a) = F(a)`` (up to the
norm's ``eps``: ``RMSNorm(alpha y) = y / sqrt(ms(y) + eps / alpha^2)``), so its gradient obeys
``dF/da(alpha a) = dF/da(a) / alpha`` and the zero-baseline IG sum of any rule with nodes
``alpha_k > 0`` and weights ``w_k`` would be exactly

    IG = a * sum_k w_k dF/da(alpha_k a) = (sum_k w_k / alpha_k) * a * dF/da(a),

a constant times gradient x activation (the harmonic number H_m for the papers' 20-point right
sum). The norm's ``eps`` breaks the identity at small alpha (on Gemma 3 270M, whose FFN outputs
are small, well above float32 noise: ``benchmarks/bench_invariance.py`` prints ``h(alpha)`` against
``h(1)``, see docs/results.md), but only through ``x = eps / (alpha^2 ms)``:
``h(alpha) = alpha dF/da(alpha a)`` is a smooth, nearly constant function of ``1 / alpha^2``.
So four nodes replace the m (three rows per layer plus the clean point alpha = 1, one row
shared by all layers on the fast route): ``h`` at four nodes fixes a cubic in
``1 / alpha^2`` that gives ``h`` at every node of the rule (:func:`substitute_nodes`); the
quadratic through three of them gives the same sum to second order, and their difference (the
cubic term) must be small for the example to be accepted. Where it is not, the example is
integrated node by node, so the scores are the rule's sum either way. Used only when the rule
has at least twice as many nodes (below that the saving does not pay for the substitution's
own error, measured by ``benchmarks/bench_invariance.py``, see docs/results.md, "Closed-form IG on
Gemma 3"). This is also why fixed
quadrature rules converge so slowly on Gemma 3 with a zero baseline (docs/results.md, "Quadrature
rules"): per neuron the integrand is ``a g(a) / alpha`` down to ``alpha_c ~ sqrt(eps / ms)``, cut
off only by the norm's eps; the adaptive rule grades its nodes towards 0 for it
(:mod:`capinterp.kernels.adaptive`).
"""

from __future__ import annotations

import torch

from capinterp.core.protocol import Model

__all__ = ["N_NODES", "check_tolerance", "lagrange_basis", "scale_invariant", "substitute_nodes"]


def scale_invariant(model: Model) -> bool:
    """Whether every block's FFN output passes only through an RMSNorm (no bias) before the residual."""
    if not str(getattr(model.cfg, "normalization_type", "")).startswith("RMS"):
        return False
    for block in model.blocks:
        if not hasattr(block, "ln2_post"):
            return False
        b_out = getattr(block.mlp, "b_out", None)
        if b_out is not None and bool(torch.any(b_out != 0)):
            return False
    return True


def lagrange_basis(xs: torch.Tensor, at: torch.Tensor) -> torch.Tensor:
    """``[len(at), len(xs)]``: the Lagrange basis polynomials of the nodes ``xs`` evaluated at ``at`` (float64)."""
    xs, at = xs.double(), at.double()
    out = torch.ones(len(at), len(xs), dtype=torch.float64)
    for j in range(len(xs)):
        for i in range(len(xs)):
            if i != j:
                out[:, j] *= (at - xs[i]) / (xs[j] - xs[i])
    return out


#: Rows per layer of the closed form: h at these many nodes fixes a polynomial of one degree less.
N_NODES = 4


def substitute_nodes(
    alphas: torch.Tensor, weights: torch.Tensor, n_nodes: int = N_NODES
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``n_nodes`` nodes that stand in for the rule's, and how its sum reads off them.

    ``h(alpha) = alpha g(alpha a)`` is a smooth function of ``x = 1 / alpha^2`` (the norm sees
    ``eps x / ms``), nearly constant. Returns ``(nodes, high, low)``: nodes
    ``alpha_min^(j / (n - 1))`` for ``j = 0 .. n - 1`` (from 1 down to ``alpha_min``);
    ``sum_k w_k g(alpha_k a) ~= sum_j high_j h(nodes_j)`` with ``h`` interpolated by the
    polynomial in ``x`` through all nodes, and ``low`` the same sum from the polynomial of one
    degree less through all nodes but the second smallest (an embedded pair: ``high - low``
    estimates the top-degree term, whose size bounds the error of ``high``).
    """
    a_min = float(alphas.min())
    nodes = torch.tensor([a_min ** (j / (n_nodes - 1)) for j in range(n_nodes)], dtype=torch.float64)
    x, at = 1 / nodes**2, 1 / alphas.double() ** 2
    w = weights.double() / alphas.double()
    high = w @ lagrange_basis(x, at)
    keep = [j for j in range(n_nodes) if j != n_nodes - 2]
    low = torch.zeros(n_nodes, dtype=torch.float64)
    low[keep] = w @ lagrange_basis(x[keep], at)
    return nodes, high, low


def check_tolerance(dtype: torch.dtype) -> float:
    """Largest accepted ``max |high - low| / max |high|`` (the top-degree term) for ``dtype``.

    The error of ``high`` is of the next order; on Gemma 3 270M the estimate stays below this
    tolerance (``benchmarks/bench_invariance.py`` prints how many prompts the closed form took, its
    "closed" column, see docs/results.md). Half precisions: 16 units
    of their resolution, because there the nodes' own rounding (~1e-2 relative in bfloat16)
    dominates the estimate, and the integrated sum carries the same rounding.
    """
    return 16 * torch.finfo(dtype).eps if dtype in (torch.bfloat16, torch.float16) else 2e-3
