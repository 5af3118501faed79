"""What a prompt prefix leaves besides keys and values, and how IG's rows continue from it.

A hybrid's Mamba, linear-attention or convolution mixers carry a recurrent or convolution state, and
DeepSeek-V4's attention compresses its keys and values into a cache of its own (:func:`unshared_state`).
IG's fast and prefix routes (:mod:`capinterp.kernels.prefix`) continue from such a state: rows in the
batch dimension, each block call given a fresh per-row copy of its layer's prefix cache
(:func:`state_rows`, :func:`saved_states`), every prompt's continuation checked against the full forward
(:func:`continuation_error`).
"""

from __future__ import annotations

import contextlib
import copy
from typing import Any

import torch

from capinterp.arch.gated_mlp import unwrap
from capinterp.core.protocol import Model

__all__ = [
    "compressed_state",
    "continuation_error",
    "family_name",
    "mixer_state",
    "saved_states",
    "state_kind",
    "state_rows",
    "tolerance",
    "unshared_state",
]


def mixer_state(model: Model) -> str | None:
    """Why a hybrid's prompt prefix is more than keys and values, or None: its mixers (Mamba, linear
    attention, short convolutions) carry a recurrent or convolution state of their own."""
    from capinterp.arch.family import family_of, layer_kinds

    fam = family_of(model)
    if not fam.hybrid_layers:
        return None
    return (
        f"{fam.name}'s layers include {layer_kinds(fam)}: the mixers carry a state of their own (recurrent or "
        "convolution), not a key/value cache that the rows could share"
    )


def compressed_state(model: Model) -> str | None:
    """Why a prompt prefix's attention cache cannot be reused, or None: DeepSeek-V4's attention compresses
    its keys and values into a cache of its own (a compressor's buffered blocks beside them)."""
    compressed = [
        l for l, b in enumerate(model.blocks) if getattr(unwrap(getattr(b, "attn", None)), "compressor", None)
    ]
    if not compressed:
        return None
    return (
        f"{family_name(model)}'s attention in layers {compressed} compresses its keys and values into a cache of its "
        "own (a compressor's buffered blocks beside the keys and values): a state of their own, not a key/value "
        "cache that the rows could share"
    )


def unshared_state(model: Model) -> str | None:
    """Why a prompt prefix's state is not simply continued from (gradient x activation, causal tracing), or
    None: :func:`mixer_state` or :func:`compressed_state`. IG's routes continue such a state, checked on every
    prompt against the full forward (:func:`clean_suffix`)."""
    return mixer_state(model) or compressed_state(model)


def state_kind(model: Model) -> str:
    """What a continuation reads of the prefix besides keys and values, in words."""
    return "its mixers' state" if mixer_state(model) else "its compressed keys and values"


def family_name(model: Model) -> str:
    from capinterp.arch.family import family_of

    return family_of(model).name


def tolerance(ref: torch.Tensor, rtol: float, dtype: torch.dtype) -> float:
    """``rtol`` times the largest logit of ``ref`` for a model computing in float32; in half precision
    (``dtype``: the activations', not the logits': some models upcast their logits) 4 units of the
    dtype's resolution instead (two bfloat16 roundings of a logit near 25 differ by 0.25, which a
    float32 tolerance would call a broken route)."""
    if dtype in (torch.bfloat16, torch.float16):
        rtol = max(rtol, 4 * torch.finfo(dtype).eps)
    return rtol * max(1.0, ref.float().abs().max().item())


def continuation_error(
    model: Model, tokens: torch.Tensor, logits: torch.Tensor, dtype: torch.dtype, rtol: float = 1e-4
):
    """None if the suffix's ``logits`` ([S, V]), continued from the prefix's state, are the full forward's
    (``tokens`` [1, T]; ``dtype``: the model's compute dtype, :func:`tolerance`); else why not, in words.

    transformers' continuation is exact on most of these models, but not on all: Jamba's Mamba layers start
    a scan of more than one token from a zero state (its torch scan takes no initial state). One forward
    per prompt, against the many rows IG runs from it.
    """
    S = logits.shape[0]
    try:
        full = model(tokens, return_type="logits", logits_to_keep=S)[0, -S:]
    except TypeError:  # a model whose forward has no logits_to_keep
        full = model(tokens, return_type="logits")[0, -S:]
    if (logits.float() - full.float()).abs().max().item() <= tolerance(full, rtol, dtype):
        return None
    return (
        f"transformers' continuation of {family_name(model)}'s prompt prefix ({state_kind(model)}) over "
        f"{'more than one token' if S > 1 else 'one token'} does not reproduce its full forward"
    )


def state_rows(cache: Any, j: int, R: int) -> Any:
    """The prefix cache for block ``j``'s call on ``R`` rows: a shallow copy whose layer ``j`` is a fresh copy
    of the prefix's (its keys and values, its mixer's conv and recurrent states) repeated ``R`` times, which
    the call writes into; every other layer is the pristine prefix's, untouched."""
    rows = copy.copy(cache)
    rows.layers = list(cache.layers)
    layer = copy.deepcopy(cache.layers[j])
    layer.reorder_cache(torch.zeros(R, dtype=torch.long))
    rows.layers[j] = layer
    return rows


@contextlib.contextmanager
def saved_states(cache: Any, j: int):
    """Autograd keeps a copy of layer ``j``'s mixer states wherever the forward saves one for its backward.

    A mixer writes its new state into the cache's tensor in place (transformers' Mamba-2 decode step:
    ``state * dA`` saves ``state``, then ``state.copy_(...)``), which would fail the backward of a row whose
    gradient passes through that product (Falcon-H1, a Mamba mixer in every layer)."""
    layer = cache.layers[j]
    states = [*getattr(layer, "conv_states", {}).values(), *getattr(layer, "recurrent_states", {}).values()]
    ptrs = {t.untyped_storage().data_ptr() for t in states if isinstance(t, torch.Tensor)}

    def pack(t: torch.Tensor) -> torch.Tensor:
        return t.clone() if t.untyped_storage().data_ptr() in ptrs else t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield
