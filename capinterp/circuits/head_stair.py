"""Exact single-head patching without recomputing what the patch leaves unchanged.

Patching head ``h`` of layer ``l`` (its output ``a_h`` replaced by ``ref_h`` at every position)
leaves every layer below ``l``, and layer ``l``'s attention itself, equal to the clean run. So the
clean run is made once per example (:func:`capinterp.kernels.prefix.clean_suffix`, which records
each block's input residual and call arguments), and the patched rows start at block ``l`` from
that recorded residual: the rows of layer ``l``'s heads join the batch there, and the point where
layer ``l``'s attention output joins the residual stream (the post-attention norm's output on a
post-norm block) gets ``- (a_h - ref_h)`` in row ``h``. Blocks are called directly with the rows
folded into the sequence (:func:`capinterp.kernels.prefix.stair_logits`'s layout), and logits are
computed at the answer position only. A row costs ``L - l`` blocks instead of ``L`` and one
position's unembedding instead of every position's.

This equals :func:`capinterp.circuits.head_patching.head_effects`'s graph pass with the head's
outgoing edges removed (every downstream slot reads the residual less ``a_h - ref_h``), checked in
the tests to 1e-5. :func:`stair_route` says where it applies (one residual stream, no layer scales,
no per-layer embeddings, no hybrid mixers, no windowed module attention); elsewhere the graph route
runs.
"""

from __future__ import annotations

from typing import Any

import torch
from einops import rearrange

from capinterp.arch.family import family_of
from capinterp.arch.forward import batch_first, block_layout, collapse_streams, unembed
from capinterp.arch.layer_extras import ple_layers, stream_scales
from capinterp.circuits.graph import Graph
from capinterp.core.protocol import Model
from capinterp.core.tokens import Encoded
from capinterp.kernels import prefix as px

__all__ = ["MAX_ROWS", "edit_hook", "stair_head_probs", "stair_route"]

#: rows (patched copies of one prompt) per block call: the folded mask grows with the square of rows
MAX_ROWS = 32


def stair_route(model: Model, graph: Graph) -> bool:
    """Can the stair route run this model's head patching (see the module docstring)?"""
    fam = family_of(model)
    return (
        not fam.hybrid_layers
        and fam.residual_streams == 1
        and fam.altup_streams == 1
        and fam.module_window is None
        and fam.attn_out_multiplier == 1.0
        and fam.residual_multiplier == 1.0
        and not ple_layers(model)
        and all(p == 1.0 for p in stream_scales(model))
        and graph.granularity in ("qkv", "head")
        and all(edit_hook(model, l) in model.hook_dict for l in graph.head_layers)
    )


def edit_hook(model: Model, l: int) -> str:
    """The hook whose output is what layer ``l``'s attention adds to the residual stream."""
    post = f"blocks.{l}.ln1_post.hook_out"
    return post if post in model.hook_dict else f"blocks.{l}.attn.hook_out"


def _subtract_tail(delta: torch.Tensor, act: torch.Tensor, hook: Any) -> torch.Tensor:
    """Folded rows ``[1, R * S, d]``: the rows that joined at this block (the tail) less ``delta``."""
    n = delta.shape[1]
    return torch.cat([act[:, :-n], act[:, -n:] - delta.to(act.dtype)], dim=1)


def _groups(layers: list[int], H: int) -> list[list[int]]:
    """Consecutive head layers in groups of at most :data:`MAX_ROWS` rows (at least one layer each)."""
    out: list[list[int]] = [[]]
    for l in layers:
        if out[-1] and (len(out[-1]) + 1) * H > MAX_ROWS:
            out.append([])
        out[-1].append(l)
    return out


@torch.no_grad()
def stair_head_probs(model: Model, graph: Graph, item: Encoded, delta: torch.Tensor) -> tuple[float, torch.Tensor]:
    """(clean p(target), ``[n_heads_total]`` p(target) with each head patched alone) at ``item``'s
    last prompt position; ``delta``: ``[S, n_heads_total, d]`` ``a_h - ref_h`` at the prompt's
    positions (:func:`~capinterp.circuits.head_patching.head_sources` order)."""
    S = len(item.prompt_ids)
    run = px.clean_suffix(model, torch.tensor(item.prompt_ids), 0)
    target = item.target_ids[0]
    clean = float(run.logits[-1].float().softmax(-1)[target])
    H, layers = graph.n_heads, graph.head_layers
    out = []
    for group in _groups(layers, H):
        hooks = []
        for l in group:
            i = layers.index(l)
            d = rearrange(delta[:, i * H : (i + 1) * H], "s h d -> 1 (h s) d")
            hooks.append((edit_hook(model, l), _bind(d)))
        out.append(_run_rows(model, run, group, H, S, hooks)[:, target])
    return clean, torch.cat(out).double().cpu()


def _bind(d: torch.Tensor) -> Any:
    return lambda act, hook: _subtract_tail(d, act, hook)


def _run_rows(model: Model, run: px.CleanSuffix, group: list[int], H: int, S: int, hooks: list) -> torch.Tensor:
    """``[len(group) * H, V]`` probabilities at the last position: ``H`` rows join at each layer of
    ``group`` (from the recorded clean residual) and run to the top."""
    cache = px._PrefixKV({})
    h, R = None, 0
    with model.hooks(fwd_hooks=hooks):
        for j in range(group[0], len(model.blocks)):
            if j in group:
                new = run.resid[j].repeat(1, H, 1)
                h = new if h is None else torch.cat([h, new], dim=1)
                R += H
            args, kwargs = px._folded_call(run, j, R)
            if px._SHARED_KV in kwargs:
                raise px.Unsupported("layers that share keys and values")
            cache_arg = kwargs.pop(px._CACHE_ARG, "past_key_values")
            assert h is not None  # the first block of the group sets it
            out = model.blocks[j](block_layout(model, h), *args, **kwargs, **{cache_arg: cache})
            h = batch_first(model, out[0] if isinstance(out, (tuple, list)) else out)
    assert h is not None
    last = collapse_streams(model, rearrange(h, "1 (r s) d -> r s d", r=R))[:, S - 1 : S]
    return unembed(model, last)[:, 0].float().softmax(-1)
