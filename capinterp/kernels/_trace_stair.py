"""Causal tracing's stair: each restoration starts at its window's first layer, over the corrupted run.

Restoring a state at token t and layers ``[a, b)`` leaves every state below layer ``a`` equal to the
corrupted run's, and every position before t too (causal attention). So, per token t:

1. :func:`record` runs the ``S`` corrupted copies once: the prefix ``0..t-1`` (its own forward, so a
   sliding-window cache is never cropped), then the suffix ``t..T-1`` over that prefix's cache,
   recording what each block received (its input residual, its call arguments) and the prefix
   keys/values each attention layer read, and the corrupted logits at the last position.
2. :func:`stair_probs` runs restoration rows (restoration x sample, in the batch dimension) by
   calling the bridge's blocks directly: a row joins at its window's first layer ``a`` with the
   corrupted residual recorded there (its own sample's), so block ``j`` runs only the rows whose
   window starts at or below ``j``, over positions ``t..T-1`` only, each row reading its sample's
   prefix keys/values. Clean states are written back by the usual hooks (the blocks are the bridge's,
   so hooks fire). Only the last position is unembedded.

:func:`check` compares the stair's corrupted rows (joining at block 0, nothing restored) with the
recorded forward's logits; :class:`~capinterp.kernels.prefix.Unsupported` (raised on a mismatch or on a
call layout the stair cannot replay) sends the caller back to the bridge route.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import torch
from einops import repeat
from jaxtyping import Float, Int
from torch import Tensor

from capinterp.arch.forward import batch_first, block_layout, collapse_streams, unembed
from capinterp.core.protocol import Model
from capinterp.kernels.prefix import (
    _CACHE_ARG,
    _SHARED_KV,
    Unsupported,
    _batched_call,
    _map_tables,
    _PrefixKV,
    _split_call,
    spy_prefix_kv,
)
from capinterp.kernels.prefix_state import tolerance

__all__ = ["Corrupted", "Unsupported", "check", "noise_hook", "record", "stair_probs"]


@dataclass
class Corrupted:
    """The S corrupted copies of one fact, split at token ``t`` (see the module docstring)."""

    resid: list[Tensor]  # per block: input residual [S, n, (streams,) d], batch first
    calls: list[tuple[tuple, dict]]  # per block: (args, kwargs) minus hidden and cache, batch 1
    prefix_kv: dict[int, tuple[Tensor, Tensor]]  # per attention layer: prefix keys, values [S, ...]
    logits: Tensor  # [S, V] at the last position, from the bridge's own forward
    memo: dict = field(default_factory=dict)  # _batched_call's widened arguments


def noise_hook(model_hook: str, noise: Tensor, span: tuple[int, int], p0: int, p1: int):
    """Hook adding ``noise`` [S, s1 - s0, d] to the subject positions inside the run's positions ``[p0, p1)``."""
    s0, s1 = span
    lo, hi = max(s0, p0), min(s1, p1)

    def corrupt(act, hook):
        if hi <= lo:
            return act
        act = act.clone()
        act[:, lo - p0 : hi - p0] += noise[:, lo - s0 : hi - s0].to(act.dtype)
        return act

    return (model_hook, corrupt)


def _first_row(x: Any, S: int) -> Any:
    """A per-row call argument of the S copies as one row's (they are the positions', the same for every
    copy); :class:`Unsupported` when the copies differ."""
    if not isinstance(x, Tensor) or x.ndim == 0 or x.shape[0] == 1 or S == 1:
        return x
    if x.shape[0] % S:
        raise Unsupported(f"call argument of shape {tuple(x.shape)} ({S} rows)")
    parts = x.reshape(S, x.shape[0] // S, *x.shape[1:])
    if not bool((parts == parts[:1]).all()):
        raise Unsupported("call arguments that differ between the corrupted copies")
    return parts[0]


def _one_row(rest: tuple, kwargs: dict, S: int) -> tuple[tuple, dict]:
    if _SHARED_KV in kwargs:
        raise Unsupported("KV-sharing layers")
    kw = {}
    for name, value in kwargs.items():
        if name == "cache_position":
            kw[name] = value
        elif name == "position_embeddings" and isinstance(value, (tuple, dict)):
            kw[name] = _map_tables(value, functools.partial(_first_row, S=S))
        else:
            kw[name] = _first_row(value, S)
    return tuple(_first_row(a, S) for a in rest), kw


def _keep_last(act, hook):
    """The last position only, contiguous: a strided ``act[:, -1:]`` makes PyTorch run the unembedding
    as a batched matmul over per-row copies of W_U when the parameters do not require gradients."""
    return act[:, -1:].contiguous()


@torch.no_grad()
def record(model: Model, ids: Int[Tensor, "1 T"], t: int, noise_of, S: int) -> Corrupted:
    """The S corrupted copies split at ``t`` (``noise_of(p0, p1)``: the noise hook for positions ``[p0, p1)``)."""
    tokens = repeat(ids, "1 t -> s t", s=S)
    T, n_blocks = tokens.shape[1], len(model.blocks)
    cache = None
    if t > 0:
        _, cache = model.run_with_hooks(
            tokens[:, :t], fwd_hooks=[noise_of(0, t)], return_type="logits_and_cache", use_cache=True
        )
        if cache is None or not callable(getattr(cache, "update", None)):
            raise Unsupported("the model returned no KV cache")
    prefix_kv: dict[int, tuple[Tensor, Tensor]] = spy_prefix_kv(cache) if cache is not None else {}
    resid: list[Any] = [None] * n_blocks
    calls: list[Any] = [None] * n_blocks

    def pre(j, module, args, kwargs):
        if resid[j] is not None:
            raise Unsupported(f"block {j} ran twice in one forward")
        hidden, rest, kw = _split_call(module, args, kwargs)
        resid[j] = batch_first(model, hidden.detach())
        calls[j] = _one_row(rest, kw, S)

    handles = [
        b.register_forward_pre_hook(functools.partial(pre, j), with_kwargs=True) for j, b in enumerate(model.blocks)
    ]
    try:
        logits = model.run_with_hooks(
            tokens[:, t:],
            past_key_values=cache,
            fwd_hooks=[noise_of(t, T), ("unembed.hook_in", _keep_last)],
        )
    finally:
        for h in handles:
            h.remove()
    if any(r is None for r in resid):
        raise Unsupported("some block did not run on the suffix")
    return Corrupted(resid=resid, calls=calls, prefix_kv=prefix_kv, logits=logits[:, -1].detach())


def stair_probs(
    model: Model,
    rec: Corrupted,
    starts: list[int],
    samples: Int[Tensor, " rows"],
    hooks: list,
) -> Float[Tensor, "rows V"]:
    """Last-position logits of rows joining at blocks ``starts`` (ascending) with their samples' corrupted
    residuals, under ``hooks`` (which restore the rows' clean states; row indices are the rows' order)."""
    if starts != sorted(starts):
        raise ValueError("rows must be ordered by the block they join at")
    dev = rec.resid[0].device
    samples = samples.to(dev)
    h: Tensor | None = None
    have = 0
    with model.hooks(fwd_hooks=hooks):
        for j in range(starts[0], len(model.blocks)):
            n_new = sum(1 for s in starts[have:] if s == j)
            if n_new:
                new = rec.resid[j][samples[have : have + n_new]]
                h = new if h is None else torch.cat([h, new])
                have += n_new
            assert h is not None
            args, kw = _batched_call(rec, j, have)  # type: ignore[arg-type]  # duck-typed: calls, memo
            cache_arg = kw.pop(_CACHE_ARG, "past_key_values")
            kv = rec.prefix_kv.get(j)
            sel = samples[:have]
            cache = _PrefixKV({} if kv is None else {j: (kv[0][sel], kv[1][sel])})
            out = model.blocks[j](block_layout(model, h), *args, **kw, **{cache_arg: cache})
            h = batch_first(model, out[0] if isinstance(out, (tuple, list)) else out)
    assert h is not None
    last = collapse_streams(model, h[:, -1:].contiguous())
    return unembed(model, last)[:, 0]


def check(model: Model, rec: Corrupted, dtype: torch.dtype, rtol: float = 1e-4) -> None:
    """Raise :class:`Unsupported` unless the stair reproduces the recorded corrupted logits."""
    S = rec.logits.shape[0]
    try:
        got = stair_probs(model, rec, [0] * S, torch.arange(S), [])
    except Unsupported:
        raise
    except Exception as err:  # a call layout the direct block calls cannot replay
        raise Unsupported(f"direct block calls failed: {type(err).__name__}: {err}") from None
    if got.shape != rec.logits.shape:
        raise Unsupported(f"direct block calls gave logits of shape {tuple(got.shape)}")
    diff = (got.float() - rec.logits.float()).abs().max().item()
    if diff > tolerance(rec.logits, rtol, dtype):
        raise Unsupported(f"direct block calls do not reproduce the corrupted logits (max diff {diff:.3g})")
