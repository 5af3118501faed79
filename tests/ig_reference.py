"""A slow, obviously-correct reference for the IG kernel; used by the tests only.

One sequence at a time, one interpolation step at a time, the whole teacher-forced text
``x + y`` through the model's ordinary forward, plain autograd. Deliberately shares no code
with :mod:`capinterp.kernels.ig` (positions, coefficients and the objective are recomputed
here from the definitions), so a mistake there cannot hide in both.
"""

from __future__ import annotations

import torch

from capinterp.arch.model import neuron_hook
from capinterp.core.tokens import Encoded


def ref_positions(enc: Encoded, positions: str = "answer") -> tuple[list[int], list[int]]:
    """(scaled/read positions, target token read at each) in the sequence ``enc.ids``."""
    n = len(enc.prompt_ids)
    if positions == "answer":
        return [n - 1 + j for j in range(len(enc.target_ids))], list(enc.target_ids)
    if positions == "last_prompt":
        return [n - 1], [enc.target_ids[0]]
    raise ValueError(positions)


def ref_objective(
    model,
    enc: Encoded,
    *,
    positions: str = "answer",
    objective: str = "prob",
    layer: int | None = None,
    value: torch.Tensor | None = None,
) -> torch.Tensor:
    """F for one example; with ``layer``/``value``, ``hook_post[layer]`` at the positions is ``value``."""
    pos, tgt = ref_positions(enc, positions)
    tokens = torch.tensor([enc.ids], device=model.cfg.device)
    hooks = []
    if layer is not None:

        def put(act, hook):
            act = act.clone()
            act[0, pos] = value.to(act.dtype)
            return act

        hooks = [(neuron_hook(layer), put)]
    logits = model.run_with_hooks(tokens, fwd_hooks=hooks)[0]
    total = torch.zeros((), dtype=torch.float32, device=logits.device)
    for p, t in zip(pos, tgt):
        logp = torch.log_softmax(logits[p].float(), dim=-1)[t]
        total = total + (logp.exp() if objective == "prob" else logp)
    return total / len(pos)


def ref_activation(model, enc: Encoded, layer: int, positions: str = "answer") -> torch.Tensor:
    """Clean ``hook_post[layer]`` at the positions, [|P|, d_mlp] float32."""
    pos, _ = ref_positions(enc, positions)
    _, cache = model.run_with_cache(torch.tensor([enc.ids], device=model.cfg.device))
    return cache[neuron_hook(layer)][0, pos].float().detach()


def ref_gauss(m: int) -> tuple[list[float], list[float]]:
    """Gauss-Legendre on [0, 1] by Golub-Welsch: eigenvalues of the Jacobi matrix of the
    Legendre recurrence (off-diagonal k / sqrt(4k^2 - 1)) are the nodes on [-1, 1], and twice
    the squared first components of the eigenvectors are the weights."""
    k = torch.arange(1, m, dtype=torch.float64)
    off = k / torch.sqrt(4 * k * k - 1)
    J = torch.diag(off, 1) + torch.diag(off, -1)
    x, v = torch.linalg.eigh(J)
    w = 2 * v[0] ** 2
    return ((x + 1) / 2).tolist(), (w / 2).tolist()


def ref_rule(steps: int, rule: str) -> list[tuple[float, float]]:
    """[(alpha_k, w_k)] for k in 1..steps, from the definitions."""
    m = steps
    if rule == "right":
        return [(k / m, 1 / m) for k in range(1, m + 1)]
    if rule == "left":
        return [((k - 1) / m, 1 / m) for k in range(1, m + 1)]
    if rule == "midpoint":
        return [((k - 0.5) / m, 1 / m) for k in range(1, m + 1)]
    if rule == "linspace":
        return [((k - 1) / (m - 1), 1 / m) for k in range(1, m + 1)]
    if rule == "trapezoid":
        return [((k - 1) / (m - 1), (0.5 if k in (1, m) else 1.0) / (m - 1)) for k in range(1, m + 1)]
    if rule == "gauss":
        return list(zip(*ref_gauss(m)))
    raise ValueError(rule)


def ref_gradient(model, enc: Encoded, layer: int, value: torch.Tensor, **kw) -> torch.Tensor:
    """dF / d hook_post[layer] at the positions, evaluated at ``value`` [|P|, d_mlp]."""
    z = value.detach().clone().requires_grad_(True)
    F = ref_objective(model, enc, layer=layer, value=z, **kw)
    (g,) = torch.autograd.grad(F, z)
    return g.float()


def ref_ig_layer(
    model,
    enc: Encoded,
    layer: int,
    *,
    steps: int = 20,
    rule: str = "right",
    positions: str = "answer",
    objective: str = "prob",
    baseline: torch.Tensor | None = None,
) -> torch.Tensor:
    """IG of one layer's neurons [d_mlp] (float32), one step at a time."""
    a = ref_activation(model, enc, layer, positions)
    b = torch.zeros_like(a) if baseline is None else baseline.float().to(a.device).expand_as(a)
    total = torch.zeros_like(a)
    for alpha, w in ref_rule(steps, rule):
        total += w * ref_gradient(model, enc, layer, b + alpha * (a - b), positions=positions, objective=objective)
    return ((a - b) * total).sum(0).cpu()


def ref_ig(model, enc: Encoded, *, layers=None, **kw) -> torch.Tensor:
    """[n_layers, d_mlp]; layers not requested are 0."""
    n_layers, d_mlp = int(model.cfg.n_layers), int(model.cfg.d_mlp)
    out = torch.zeros(n_layers, d_mlp)
    base = kw.get("baseline")
    for l in range(n_layers) if layers is None else layers:
        b = None if base is None else (base[l] if base.dim() == 2 else base)
        out[l] = ref_ig_layer(model, enc, l, **{**kw, "baseline": b})
    return out


def ref_grad_x_act(model, enc: Encoded, *, positions: str = "answer", objective: str = "prob") -> torch.Tensor:
    """[n_layers, d_mlp]: clean activation x gradient at that activation, summed over positions."""
    n_layers = int(model.cfg.n_layers)
    rows = []
    for l in range(n_layers):
        a = ref_activation(model, enc, l, positions)
        g = ref_gradient(model, enc, l, a, positions=positions, objective=objective)
        rows.append((a * g).sum(0).cpu())
    return torch.stack(rows)
