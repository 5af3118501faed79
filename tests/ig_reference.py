"""A slow, obviously-correct reference for the IG kernel; used by the tests only.

One sequence at a time, one interpolation step at a time, the whole teacher-forced text
``x + y`` through the model's ordinary forward, plain autograd. Deliberately shares no code
with :mod:`capinterp.kernels.ig` (positions, coefficients and the objective are recomputed
here from the definitions), so a mistake there cannot hide in both.
"""
from __future__ import annotations

import torch

from capinterp.core.model import neuron_hook
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


def ref_alpha(k: int, steps: int, rule: str) -> float:
    """Coefficient of step ``k`` in 1..steps."""
    if rule == "right":
        return k / steps
    if rule == "left":
        return (k - 1) / steps
    if rule == "linspace":
        return (k - 1) / (steps - 1)
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
    for k in range(1, steps + 1):
        alpha = ref_alpha(k, steps, rule)
        total += ref_gradient(model, enc, layer, b + alpha * (a - b), positions=positions, objective=objective)
    return ((a - b) * total / steps).sum(0).cpu()


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
