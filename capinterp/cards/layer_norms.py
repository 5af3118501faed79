"""Layer-level activations for layer cards: the norm of a layer's MLP output at each token.

A layer has no single activation; its card reads ``||mlp_out||_2`` (the L2 norm over ``d_model``
of ``blocks.{l}.hook_mlp_out``, what the layer's MLP adds to the residual stream) at every real
token, and keeps the same top contexts and statistics a neuron's card keeps, with the same
streaming, bounded memory and torchrun sharding as :func:`capinterp.cards.contexts.top_contexts`
(whose running top-k and statistics it reuses).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from capinterp.arch.forward import capture
from capinterp.arch.model import move_model
from capinterp.cards._act_stream import encode_texts
from capinterp.cards.contexts import UnitActivations, collect
from capinterp.core import distributed as dist
from capinterp.core.protocol import Model

__all__ = ["layer_norm_contexts", "mlp_out_hook"]


def mlp_out_hook(layer: int) -> str:
    """The hook whose norm a layer card reads: ``blocks.{layer}.hook_mlp_out``."""
    return f"blocks.{layer}.hook_mlp_out"


def _norms(model: Model, layers: list[int], tokens: torch.Tensor) -> torch.Tensor:
    """``[B, T, n_layers]`` float32: ``||mlp_out||`` of each requested layer at each position."""
    out = torch.empty(*tokens.shape, len(layers), dtype=torch.float32, device=tokens.device)

    def grabber(slot: int):
        def grab(x, hook):
            out[..., slot] = x.float().norm(dim=-1).to(out.device)
            return x

        return grab

    order = sorted(range(len(layers)), key=lambda s: layers[s])
    hooks = [(mlp_out_hook(layers[s]), grabber(s)) for s in order]
    last = capture(model, tokens, hooks[-1][0], fwd_hooks=hooks[:-1])
    out[..., order[-1]] = last.float().norm(dim=-1).to(out.device)
    return out


def layer_norm_contexts(
    model: Model,
    layers: Sequence[int],
    texts: Sequence[str],
    *,
    k: int = 10,
    window: int = 8,
    batch_size: int = 8,
    max_tokens: int | None = None,
    device: Any = None,
    progress: bool = True,
) -> list[UnitActivations]:
    """Each layer's ``k`` top contexts by ``||mlp_out||`` over ``texts``, and its statistics
    (``UnitActivations.unit`` is ``(layer, -1)``: the whole layer)."""
    layers = [int(x) for x in layers]
    ids = encode_texts(model, list(texts), max_tokens)
    move_model(model, device)
    dist.init(model.cfg.device)
    units = [(layer, -1) for layer in layers]
    return collect(
        model, units, ids, lambda t: _norms(model, layers, t), k, window, batch_size, progress, "layer contexts"
    )
