"""Hand-written references on the plain transformers model for the neuron checks.

Integrated gradients of p(target) with respect to one layer's down-projection input: a forward
pre-hook on the transformers FFN output module (``c_proj`` / ``fc_out`` / ``dense_4h_to_h`` /
``fc2`` / ``down_proj`` / ``w2``) replaces its input at one position with ``b + alpha (a - b)``, and
``torch.autograd.grad`` gives the gradient. Nothing here calls capinterp's kernels.
"""

from __future__ import annotations

from typing import Any

import torch

from capinterp.arch.linear import linear_layout
from capinterp.testing.family_checks._hf import (
    DOWN_NAMES,
    FFN_NAMES,
    SHARED_PATHS,
    branch_down,
    decoder_layers,
    outside_shared,
)

__all__ = ["clean_down_inputs", "decoder_layers", "down_proj", "ig_reference", "layer_width", "prob"]


def _in_dim(mod: torch.nn.Module) -> int | None:
    w = getattr(mod, "weight", None)
    if w is None or w.ndim != 2:
        return None
    return int(linear_layout(mod).shape[1])  # [out, in], whatever the module stores


def down_proj(hf: Any, layer: int, d_mlp: int) -> torch.nn.Module:
    """Layer ``layer``'s FFN output projection: named like one, reading ``d_mlp`` features; where no
    such module exists (a dense layer of a model mixing dense and MoE layers, narrower than the
    experts' ``d_mlp``), the one narrower module so named outside attention and shared experts."""
    block = decoder_layers(hf)[layer]
    branches = branch_down(block)
    if branches is not None:
        return branches
    named = [(name, m) for name, m in block.named_modules() if name.split(".")[-1] in DOWN_NAMES]
    found = [m for _, m in outside_shared([(n, m) for n, m in named if _in_dim(m) == d_mlp])]
    if not found:
        found = [
            m
            for name, m in named
            if (width := _in_dim(m)) is not None
            and width < d_mlp
            and not any(a in part for part in name.split(".") for a in ("attn", "attention", *SHARED_PATHS))
        ]
    if len(found) != 1:
        raise AssertionError(f"layer {layer}: {len(found)} candidate down projections")
    return found[0]


def layer_width(hf: Any, layer: int, d_mlp: int) -> int:
    """Layer ``layer``'s number of neurons: the features its down projection reads (``d_mlp``
    except on the dense layers of a model mixing dense and MoE layers)."""
    width = _in_dim(down_proj(hf, layer, d_mlp))
    assert width is not None
    return width


def down_weight(hf: Any, layer: int, d_mlp: int) -> torch.Tensor:
    """``[width, d_model]``: row i is what neuron i writes per unit activation (raw HF weight;
    ``width`` is :func:`layer_width`)."""
    mod = down_proj(hf, layer, d_mlp)
    return linear_layout(mod, torch.as_tensor(mod.weight).detach()).T


def clean_down_inputs(hf: Any, ids: torch.Tensor, d_mlp: int) -> list[torch.Tensor]:
    """Every layer's down-projection input on ``ids`` ([1, T]): ``[T, width]`` per layer (:func:`layer_width`)."""
    seen: dict[int, torch.Tensor] = {}
    handles = []
    for l in range(len(decoder_layers(hf))):

        def grab(mod, args, l=l):
            seen[l] = _batched(args[0], ids.shape[1])[0].detach().clone()

        handles.append(down_proj(hf, l, d_mlp).register_forward_pre_hook(grab))
    try:
        with torch.no_grad():
            hf(ids)
    finally:
        for h in handles:
            h.remove()
    return [seen[l] for l in range(len(seen))]


def _batched(x: torch.Tensor, T: int) -> torch.Tensor:
    """``[B, T, d]`` view of a down-projection input (OPT flattens it to ``[B * T, d]``)."""
    return x if x.ndim == 3 else x.view(-1, T, x.shape[-1])


def _replace(x: torch.Tensor, rows: torch.Tensor, pos: int, T: int) -> torch.Tensor:
    """``x`` with position ``pos`` of row r replaced by ``rows[r]``, in ``x``'s own layout."""
    x3 = _batched(x, T)
    out = torch.cat([x3[:, :pos], rows[:, None].to(x.dtype), x3[:, pos + 1 :]], dim=1)
    return out.reshape(x.shape)


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
    at position ``pos``, path ``b + alpha (a - b)``: ``(scores [width], F(x), F(b))`` (:func:`layer_width`).

    ``alphas``/``weights``: the quadrature nodes and weights (all rows in one batch).
    """
    act = clean_down_inputs(hf, ids, d_mlp)[layer][pos].double()
    # a dense layer of a mixed dense / MoE model: its neurons are the baseline's first entries
    b = torch.zeros_like(act) if baseline is None else baseline.double()[: act.shape[0]]
    m = len(alphas)
    z = (b + alphas.double()[:, None] * (act - b)).requires_grad_(True)  # [m, d_mlp]

    def put(mod, args, z=z):
        return (_replace(args[0], z, pos, ids.shape[1]), *args[1:])

    h = down_proj(hf, layer, d_mlp).register_forward_pre_hook(put)
    try:
        with torch.enable_grad():
            p = prob(hf, ids.expand(m, -1), target)
            (g,) = torch.autograd.grad(p.sum(), z)
        zb = b[None].requires_grad_(False)

        def put_b(mod, args):
            return (_replace(args[0], zb, pos, ids.shape[1]), *args[1:])

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


def _neuron_axis_parts(w: torch.Tensor, d_mlp: int, module: torch.nn.Module) -> list[torch.Tensor]:
    """The ``[d_mlp, k]`` slices of one FFN weight that belong to each neuron (none: not an FFN weight).

    A weight reading the neurons (down projection) gives its input columns; one writing them
    gives its output rows; a fused gate + up weight writing ``2 * d_mlp`` gives both halves.
    """
    out_in = linear_layout(module, w)  # nn.Linear layout [out, in] (``w``: stored as ``module`` stores its weight)
    if out_in.shape[1] == d_mlp and out_in.shape[0] != d_mlp:
        return [out_in.T]
    if out_in.shape[0] == d_mlp:
        return [out_in]
    if out_in.shape[0] == 2 * d_mlp:
        return [out_in[:d_mlp], out_in[d_mlp:]]
    return []


def _nll(hf: Any, prompt: list[int], target: list[int]) -> torch.Tensor:
    """Mean over the target tokens of -log p(token), teacher forced after ``prompt``."""
    ids = torch.tensor([prompt + target[:-1]])
    logp = hf(ids).logits[0, len(prompt) - 1 :].float().log_softmax(-1)
    return -logp[torch.arange(len(target)), torch.tensor(target)].mean()


def neuron_weight_change(hf: Any, items: list[tuple[list[int], list[int]]], lr: float, d_mlp: int) -> torch.Tensor:
    """``[n_layers, d_mlp]``: 1 - cos(w, w') per neuron after one plain SGD step (``lr``) on a copy of
    ``hf`` with every parameter trained on the mean over ``items`` ((prompt ids, target ids)) of
    the mean target-token NLL; w joins every FFN weight entry of the neuron (rows it writes,
    columns it reads; biases not). Past a dense layer's own neurons (a model mixing dense and MoE
    layers): 0, the padding owns no weight."""
    import copy

    twin = copy.deepcopy(hf)
    for p in twin.parameters():
        p.requires_grad_(True)
    layers = decoder_layers(twin)
    ffn = [
        [
            m
            for name, m in layer.named_modules()
            if not any(a in name for a in ("attn", "attention"))
            and name.split(".")[-1] in FFN_NAMES  # not a mixer's projections (LFM2's short convolution)
            and getattr(m, "weight", None) is not None
            and m.weight.ndim == 2
        ]
        for layer in layers
    ]
    before = [[(m, m.weight.detach().clone()) for m in mods] for mods in ffn]
    from capinterp.testing.family_checks._moe_ref import moe_neuron_rows

    widths = [layer_width(twin, l, d_mlp) for l in range(len(layers))]
    rows0 = {l: r.clone() for l, r in moe_neuron_rows(twin).items()}  # MoE layers (none on dense models)
    loss = sum(_nll(twin, prompt, target) for prompt, target in items) / len(items)
    assert isinstance(loss, torch.Tensor)
    loss.backward()
    with torch.no_grad():
        for p in twin.parameters():
            if p.grad is not None:
                p -= lr * p.grad
    moved = moe_neuron_rows(twin)
    # a dense layer of a model mixing dense and MoE layers: its own neurons, then padding that moved by 0
    scores = torch.zeros(len(layers), d_mlp, dtype=torch.float64)
    for l, mods in enumerate(before):
        if l in rows0:
            a, b = rows0[l].double(), moved[l].double()
        else:
            w0, w1 = [], []
            for m, w in mods:
                w0 += _neuron_axis_parts(w, widths[l], m)
                w1 += _neuron_axis_parts(m.weight.detach(), widths[l], m)
            a, b = torch.cat(w0, 1).double(), torch.cat(w1, 1).double()
        scores[l, : widths[l]] = 1 - torch.nn.functional.cosine_similarity(a, b, dim=1)
    return scores
