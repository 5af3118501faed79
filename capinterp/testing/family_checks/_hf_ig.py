"""Hand-written references on the plain transformers model for the neuron checks.

Integrated gradients of p(target) with respect to one layer's down-projection input: a forward
pre-hook on the transformers FFN output module (``c_proj`` / ``fc_out`` / ``dense_4h_to_h`` /
``fc2`` / ``down_proj``) replaces its input at one position with ``b + alpha (a - b)``, and
``torch.autograd.grad`` gives the gradient. Nothing here calls capinterp's kernels.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["clean_down_inputs", "decoder_layers", "down_proj", "ig_reference", "prob"]

_DOWN_NAMES = ("c_proj", "fc_out", "dense_4h_to_h", "fc2", "down_proj")


def decoder_layers(hf: Any) -> torch.nn.ModuleList:
    """The transformers model's list of decoder layers (the ModuleList as long as the layer count)."""
    n = hf.config.get_text_config().num_hidden_layers
    for mod in hf.modules():
        if isinstance(mod, torch.nn.ModuleList) and len(mod) == n:
            return mod
    raise AssertionError("no ModuleList of decoder layers found")


def _in_dim(mod: torch.nn.Module) -> int | None:
    w = getattr(mod, "weight", None)
    if w is None or w.ndim != 2:
        return None
    if isinstance(mod, torch.nn.Linear):
        return int(mod.in_features)
    return int(w.shape[0])  # Conv1D: weight [in, out]


def down_proj(hf: Any, layer: int, d_mlp: int) -> torch.nn.Module:
    """Layer ``layer``'s FFN output projection: named like one, reading ``d_mlp`` features."""
    found = [
        m
        for name, m in decoder_layers(hf)[layer].named_modules()
        if name.split(".")[-1] in _DOWN_NAMES and _in_dim(m) == d_mlp
    ]
    if len(found) != 1:
        raise AssertionError(f"layer {layer}: {len(found)} candidate down projections")
    return found[0]


def down_weight(hf: Any, layer: int, d_mlp: int) -> torch.Tensor:
    """``[d_mlp, d_model]``: row i is what neuron i writes per unit activation (raw HF weight)."""
    mod = down_proj(hf, layer, d_mlp)
    w = mod.weight.detach()
    return w.T if isinstance(mod, torch.nn.Linear) else w


def clean_down_inputs(hf: Any, ids: torch.Tensor, d_mlp: int) -> list[torch.Tensor]:
    """Every layer's down-projection input on ``ids`` ([1, T]): ``[T, d_mlp]`` per layer."""
    seen: dict[int, torch.Tensor] = {}
    handles = []
    for l in range(len(decoder_layers(hf))):

        def grab(mod, args, l=l):
            seen[l] = args[0][0].detach().clone()

        handles.append(down_proj(hf, l, d_mlp).register_forward_pre_hook(grab))
    try:
        with torch.no_grad():
            hf(ids)
    finally:
        for h in handles:
            h.remove()
    return [seen[l] for l in range(len(seen))]


def prob(hf: Any, ids: torch.Tensor, target: int) -> torch.Tensor:
    """p(target) at the last position of ``ids`` ([R, T]): ``[R]`` (float64 softmax)."""
    return hf(ids).logits[:, -1].double().softmax(-1)[:, target]


def ig_reference(
    hf: Any,
    ids: torch.Tensor,
    target: int,
    layer: int,
    pos: int,
    alphas: torch.Tensor,
    weights: torch.Tensor,
    d_mlp: int,
    baseline: torch.Tensor | None = None,
) -> tuple[torch.Tensor, float, float]:
    """IG of p(target) (read at the last position) w.r.t. layer ``layer``'s down-projection input
    at position ``pos``, path ``b + alpha (a - b)``: ``(scores [d_mlp], F(x), F(b))``.

    ``alphas``/``weights``: the quadrature nodes and weights (all rows in one batch).
    """
    act = clean_down_inputs(hf, ids, d_mlp)[layer][pos].double()
    b = torch.zeros_like(act) if baseline is None else baseline.double()
    m = len(alphas)
    z = (b + alphas.double()[:, None] * (act - b)).requires_grad_(True)  # [m, d_mlp]

    def put(mod, args, z=z):
        x = args[0]
        row = z[:, None].to(x.dtype)
        x = torch.cat([x[:, :pos], row, x[:, pos + 1 :]], dim=1)
        return (x, *args[1:])

    h = down_proj(hf, layer, d_mlp).register_forward_pre_hook(put)
    try:
        with torch.enable_grad():
            p = prob(hf, ids.expand(m, -1), target)
            (g,) = torch.autograd.grad(p.sum(), z)
        zb = b[None].requires_grad_(False)

        def put_b(mod, args):
            x = args[0]
            return (torch.cat([x[:, :pos], zb[:, None].to(x.dtype), x[:, pos + 1 :]], dim=1), *args[1:])

        h.remove()
        h = down_proj(hf, layer, d_mlp).register_forward_pre_hook(put_b)
        with torch.no_grad():
            f_base = float(prob(hf, ids, target)[0])
    finally:
        h.remove()
    with torch.no_grad():
        f_clean = float(prob(hf, ids, target)[0])
    scores = (act - b) * (weights.double()[:, None] * g).sum(0)
    return scores, f_clean, f_base
