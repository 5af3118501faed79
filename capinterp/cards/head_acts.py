"""Per-token quantities of attention heads for head cards: the output norm and the attention row.

A head ``(l, h)`` writes ``z_h @ W_O[h]^T`` into the residual stream at each destination token, with
``z_h`` its slice of ``blocks.{l}.attn.o.hook_in`` (TransformerLens's ``hook_z``: the attention-weighted
values, ``[batch, pos, n_heads, d_head]``) and ``W_O[h]`` its ``[d_model, d_head]`` columns of the output
projection (:func:`head_out_weight`, ``nn.Linear`` or ``Conv1D`` storage; the output bias and any
post-attention norm left out; a layer's head width read from its projection, so layers of different
head widths are right). :func:`head_norm_contexts` streams texts and keeps, per head, the top contexts and the
statistics of ``||z_h @ W_O[h]^T||_2`` with the running top-k of :func:`capinterp.cards.contexts.collect`
(one forward per batch for all heads, stopped after the last layer needed; bounded memory; torchrun
shards the texts). :func:`attention_rows` reads, for given (text, destination) pairs, the head's
attention pattern row (``blocks.{l}.attn.hook_pattern``, ``[batch, n_heads, dest, src]``: one row per
query head, so grouped-query heads sharing keys and values keep their own rows).
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import Any

import torch

from capinterp.arch.family import UnsupportedFamily, family_of, require_attention
from capinterp.arch.forward import capture
from capinterp.arch.linear import linear_layout
from capinterp.arch.model import attention_layers, move_model
from capinterp.cards._act_stream import encode_texts
from capinterp.cards.contexts import UnitActivations, collect
from capinterp.core import distributed as dist
from capinterp.core.offload import weights_readable
from capinterp.core.protocol import Model
from capinterp.core.tokens import pad_id, pad_right

__all__ = ["attention_rows", "check_heads", "head_norm_contexts", "head_out_weight", "pattern_hook", "z_hook"]


def z_hook(layer: int) -> str:
    """The hook holding layer ``layer``'s per-head attention outputs before ``W_O`` (``hook_z``)."""
    return f"blocks.{layer}.attn.o.hook_in"


def pattern_hook(layer: int) -> str:
    """The hook holding layer ``layer``'s attention pattern ``[batch, n_heads, dest, src]``."""
    return f"blocks.{layer}.attn.hook_pattern"


def check_heads(model: Model, heads: Any) -> list[tuple[int, int]]:
    """``(layer, head)`` int pairs, checked: ValueError when there are none or one is outside the model's
    attention heads; UnsupportedFamily on a model without fixed softmax heads in every layer."""
    fam = family_of(model)
    require_attention(fam, "head cards")
    out = []
    for u in heads:
        try:
            l, h = u
            if any(isinstance(x, bool) or not isinstance(x, numbers.Integral) for x in (l, h)):
                raise TypeError
        except (TypeError, ValueError):
            raise ValueError(f"heads must be (layer, head) pairs of ints, got {u!r:.80}") from None
        out.append((int(l), int(h)))
    if not out:
        raise ValueError("no heads given: pass at least one (layer, head)")
    layers = set(attention_layers(model))
    for l, h in out:
        if l not in layers or not 0 <= h < fam.n_heads:
            raise ValueError(
                f"head ({l}, {h}) is out of range: the model has {fam.n_layers} layers of {fam.n_heads} heads"
            )
    return out


def head_out_weight(model: Model, layer: int, head: int) -> torch.Tensor:
    """``W_O[h]``, float32 ``[d_model, d_head]``: head ``head``'s columns of layer ``layer``'s output projection."""
    fam = family_of(model)
    o = getattr(getattr(model.blocks[layer].attn, "o", None), "original_component", None)
    if o is None or not isinstance(getattr(o, "weight", None), torch.Tensor):
        raise UnsupportedFamily(f"{fam.name}: layer {layer}'s attention exposes no separate output projection")
    with weights_readable(o):
        w = linear_layout(o).float()  # [d_model, n_heads * d_head]
    if w.shape[1] % fam.n_heads:
        raise UnsupportedFamily(
            f"{fam.name}: layer {layer}'s output projection {tuple(w.shape)} is not {fam.n_heads} heads"
        )
    dh = w.shape[1] // fam.n_heads
    return w[:, head * dh : (head + 1) * dh].clone()


def _per_head(z: torch.Tensor, n_heads: int) -> torch.Tensor:
    """``[B, T, n_heads, d_head]`` from ``hook_z``'s output, flattened (``[B, T, n_heads * d_head]``) or not."""
    return z if z.ndim == 4 else z.reshape(*z.shape[:2], n_heads, -1)


def _norms(model: Model, heads: list[tuple[int, int]], w_o: list[torch.Tensor], tokens: torch.Tensor) -> torch.Tensor:
    """``[B, T, n]`` float32: ``||z_h @ W_O[h]^T||`` of each head at each position."""
    n_heads = family_of(model).n_heads
    out = torch.empty(*tokens.shape, len(heads), dtype=torch.float32, device=tokens.device)
    by_layer: dict[int, list[int]] = {}
    for slot, (l, _) in enumerate(heads):
        by_layer.setdefault(l, []).append(slot)

    def fill(layer: int, z: torch.Tensor) -> None:
        z = _per_head(z, n_heads)
        for slot in by_layer[layer]:
            w = w_o[slot].to(z.device)
            out[..., slot] = (z[:, :, heads[slot][1]].float() @ w.T).norm(dim=-1).to(out.device)

    def grabber(layer: int):
        def grab(x, hook):
            fill(layer, x)
            return x

        return grab

    layers = sorted(by_layer)
    hooks = [(z_hook(l), grabber(l)) for l in layers]
    fill(layers[-1], capture(model, tokens, hooks[-1][0], fwd_hooks=hooks[:-1]))
    return out


def head_norm_contexts(
    model: Model,
    heads: Sequence[tuple[int, int]],
    texts: Sequence[str],
    *,
    k: int = 10,
    window: int = 8,
    batch_size: int = 8,
    max_tokens: int | None = None,
    device: Any = None,
    progress: bool = True,
) -> list[UnitActivations]:
    """Each head's ``k`` top contexts by its output norm over ``texts`` and the norm's statistics."""
    units = check_heads(model, heads)
    ids = encode_texts(model, list(texts), max_tokens)
    move_model(model, device)
    dist.init(model.cfg.device)
    w_o = [head_out_weight(model, l, h) for l, h in units]
    read = lambda t: _norms(model, units, w_o, t)  # noqa: E731
    return collect(model, units, ids, read, k, window, batch_size, progress, "head contexts")


def attention_rows(
    model: Model,
    ids: list[list[int]],
    wanted: Sequence[tuple[tuple[int, int], int, int]],
    batch_size: int = 8,
) -> dict[tuple[tuple[int, int], int, int], list[float]]:
    """For each ``(head, text, position)`` of ``wanted``: the head's attention weights from destination
    ``position`` of text ``ids[text]`` to sources ``0..position`` (float32, summing to 1)."""
    n_heads = family_of(model).n_heads
    texts = sorted({t for _, t, _ in wanted})
    layers = sorted({u[0] for u, _, _ in wanted})
    dev, pad = torch.device(model.cfg.device), pad_id(model.tokenizer)
    out: dict[tuple[tuple[int, int], int, int], list[float]] = {}
    for s in range(0, len(texts), batch_size):
        group = texts[s : s + batch_size]
        tokens, _ = pad_right([ids[t] for t in group], pad)  # right padding: no real row reads a pad
        got: dict[int, torch.Tensor] = {}

        def grabber(layer: int):
            def grab(x, hook):
                got[layer] = x.detach().float().cpu()
                return x

            return grab

        hooks = [(pattern_hook(l), grabber(l)) for l in layers]
        with torch.no_grad():
            got[layers[-1]] = capture(model, tokens.to(dev), hooks[-1][0], fwd_hooks=hooks[:-1]).detach().float().cpu()
        for key in wanted:
            (l, h), t, p = key
            if t in group:
                pat = got[l]
                if pat.shape[1] != n_heads:
                    raise ValueError(f"{pattern_hook(l)} has {pat.shape[1]} heads, expected {n_heads}")
                out[key] = pat[group.index(t), h, p, : p + 1].tolist()
    return out
