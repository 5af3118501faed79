"""Partial forward passes: capture one hook and stop, and unembed only the needed positions.

With Gemma 3's 262k-token vocabulary, full logits for a batch of 20 prompts of 250 tokens
take 5 GB; the final residual is 2000x smaller. :func:`logits_at` runs the blocks through the
bridge (so every hook, e.g. an erasure, applies), stops at the final norm's input, and
unembeds only the requested positions with :func:`unembed`.
"""

from __future__ import annotations

import torch

from capinterp.arch.family import family_of, logit_transform
from capinterp.core.protocol import Model

__all__ = ["batch_first", "block_layout", "capture", "collapse_streams", "logits_at", "unembed"]


class _Stop(Exception):
    """Raised by a capture hook to end the forward pass once its value is in hand."""


def capture(model: Model, tokens: torch.Tensor, hook_name: str, fwd_hooks=()) -> torch.Tensor:
    """The activation at ``hook_name`` for ``tokens``; the forward stops there. Hooks apply."""
    box: list[torch.Tensor] = []

    def grab(x, hook):
        box.append(x)
        raise _Stop

    try:
        model.run_with_hooks(tokens, fwd_hooks=[*fwd_hooks, (hook_name, grab)])
    except _Stop:
        pass
    if not box:
        raise RuntimeError(f"{hook_name} did not fire: this architecture has no such hook")
    return box[0]


def collapse_streams(model: Model, h: torch.Tensor) -> torch.Tensor:
    """The last block's output as the final norm reads it: ``h`` itself (``[..., pos, d_model]``), or, on a
    model whose residual is several streams (``[..., pos, n_streams, d_model]``, :func:`batch_first`'s
    layout), the model's own collapse of them: DeepSeek-V4's ``hc_head`` (learned, input-dependent
    weights), Gemma 3n's AltUp (:func:`_altup_collapse`)."""
    fam = family_of(model)
    if fam.altup_streams > 1 and h.ndim >= 4 and h.shape[-2] == fam.altup_streams:
        return _altup_collapse(model, h)
    streams = fam.residual_streams
    if h.ndim <= 3 or streams <= 1 or h.shape[-2] != streams:
        return h
    return model.hc_head(h)


def _altup_collapse(model: Model, h: torch.Tensor) -> torch.Tensor:
    """Gemma 3n's end of the layers: stream 0, and every other stream through its
    ``altup_unembed_projections`` rescaled to stream 0's root-mean-square, averaged."""
    projections = model.__dict__.get("capinterp_altup_unembed")  # found once per model: the fast route's hot path
    if projections is None:
        projections = next(
            m for n, m in model.original_model.named_modules() if n.endswith("altup_unembed_projections")
        )
        model.__dict__["capinterp_altup_unembed"] = projections
    first = h[..., 0, :]
    target = first.pow(2).mean(-1, keepdim=True).sqrt()
    parts = [first]
    for i, proj in enumerate(projections, start=1):
        x = proj(h[..., i, :]).to(first.dtype)
        parts.append(x * target / x.pow(2).mean(-1, keepdim=True).clamp(min=1e-5).sqrt())
    return torch.stack(parts).mean(0)


def batch_first(model: Model, h: torch.Tensor) -> torch.Tensor:
    """A block's input or output with the batch first: Gemma 3n's AltUp streams (``[streams, batch, pos,
    d_model]``, the streams axis first) as ``[batch, pos, streams, d_model]`` (a view); ``h`` elsewhere."""
    return h.movedim(0, 2) if family_of(model).altup_streams > 1 else h


def block_layout(model: Model, h: torch.Tensor) -> torch.Tensor:
    """The inverse of :func:`batch_first`: what a block takes (AltUp's streams axis first again)."""
    return h.movedim(2, 0) if family_of(model).altup_streams > 1 else h


def unembed(model: Model, h: torch.Tensor) -> torch.Tensor:
    """Final norm + unembedding + the family's own final steps (logit multiplier, soft-cap).

    The family facts come from the model's record (:func:`capinterp.arch.family.family_of`);
    :func:`capinterp.arch.family.check_logit_path` checks at load that this equals the model's
    own logits.
    """
    return logit_transform(family_of(model), model.unembed(model.ln_final(h)))


def logits_at(model: Model, tokens: torch.Tensor, positions: torch.Tensor, fwd_hooks=()) -> torch.Tensor:
    """Logits at ``positions[b]`` of each row ``b``: ``[batch, d_vocab]`` (float32)."""
    resid = capture(model, tokens, "ln_final.hook_in", fwd_hooks)
    rows = torch.arange(tokens.shape[0], device=resid.device)
    picked = resid[rows, positions.to(resid.device)][:, None]
    return unembed(model, picked)[:, 0].float()
