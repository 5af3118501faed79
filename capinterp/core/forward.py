"""Partial forward passes: capture one hook and stop, and unembed only the needed positions.

With Gemma 3's 262k-token vocabulary, full logits for a batch of 20 prompts of 250 tokens
take 5 GB; the final residual is 2000x smaller. :func:`logits_at` runs the blocks through the
bridge (so every hook, e.g. an erasure, applies), stops at the final norm's input, and
unembeds only the requested positions with :func:`unembed`.
"""

from __future__ import annotations

import torch

from capinterp.core.family import family_of, logit_transform
from capinterp.core.protocol import Model

__all__ = ["capture", "collapse_streams", "logits_at", "unembed"]


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
    model whose residual is several streams (DeepSeek-V4's hyper-connections: ``[..., pos, n_streams,
    d_model]``), the model's own collapse of them (``hc_head``: learned, input-dependent weights)."""
    streams = family_of(model).residual_streams
    if h.ndim <= 3 or streams <= 1 or h.shape[-2] != streams:
        return h
    return model.hc_head(h)


def unembed(model: Model, h: torch.Tensor) -> torch.Tensor:
    """Final norm + unembedding + the family's own final steps (logit multiplier, soft-cap).

    The family facts come from the model's record (:func:`capinterp.core.family.family_of`);
    :func:`capinterp.core.family.check_logit_path` checks at load that this equals the model's
    own logits.
    """
    return logit_transform(family_of(model), model.unembed(model.ln_final(h)))


def logits_at(model: Model, tokens: torch.Tensor, positions: torch.Tensor, fwd_hooks=()) -> torch.Tensor:
    """Logits at ``positions[b]`` of each row ``b``: ``[batch, d_vocab]`` (float32)."""
    resid = capture(model, tokens, "ln_final.hook_in", fwd_hooks)
    rows = torch.arange(tokens.shape[0], device=resid.device)
    picked = resid[rows, positions.to(resid.device)][:, None]
    return unembed(model, picked)[:, 0].float()
