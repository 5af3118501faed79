"""The reference side for NemotronH, whose layers are one sublayer each (a mixer or an FFN alone).

A layer without an FFN has no neurons. :func:`reference_model` gives each such layer of a plain
transformers model an FFN with none (``up_proj`` ``d_model -> 0``, ``down_proj`` ``0 -> d_model``, its
output 0), called after the layer's mixer and added to it, so the other checks' references (pre-hooks
on each layer's down projection, its weight as value rows) see a layer of width 0 there. Written
here independently of :mod:`capinterp.arch.one_sublayer`; the logits are checked unchanged. Mixture-of-experts
models are also made dense (:func:`._moe_ref.densify`).
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from capinterp.testing.contract import require

__all__ = ["reference_model"]

_FFN_KINDS = ("mlp", "moe")


class _MixerThenNothing(torch.nn.Module):
    """A mixer, then an FFN with no neurons on its output (which adds 0)."""

    def __init__(self, mixer: torch.nn.Module, d_model: int) -> None:
        super().__init__()
        self.inner = mixer
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # zero-element weights: nothing to initialize
            self.up_proj = torch.nn.Linear(d_model, 0, bias=False)
            self.down_proj = torch.nn.Linear(0, d_model, bias=False)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        out = self.inner(*args, **kwargs)
        h = out[0] if isinstance(out, tuple) else out
        h = h + self.down_proj(torch.relu(self.up_proj(h)))
        return (h, *out[1:]) if isinstance(out, tuple) else h


@torch.no_grad()
def _empty_ffns(hf: Any) -> Any:
    kinds = getattr(hf.config, "layers_block_type", None)
    if not isinstance(kinds, (list, tuple)) or not set(kinds) & set(_FFN_KINDS) or getattr(hf, "_ref_empty", False):
        return hf
    ids = torch.tensor([[1, 5, 9, 30, 7, 2]])
    before = hf(ids).logits
    for layer, kind in zip(hf.model.layers, kinds, strict=True):
        if kind not in _FFN_KINDS:
            layer.mixer = _MixerThenNothing(layer.mixer, int(hf.config.hidden_size))
    err = float((hf(ids).logits - before).abs().max())
    require(err == 0.0, lambda: f"the empty FFNs changed the logits by {err:.3g}")
    hf._ref_empty = True
    return hf


def reference_model(hf: Any) -> Any:
    """``hf`` (in place) as the references read it: MoE blocks made dense (Gemma 4's experts beside the MLP
    by :mod:`._branch_ref`), a layer without an FFN given one with no neurons."""
    from capinterp.testing.family_checks._branch_ref import dense_branches
    from capinterp.testing.family_checks._moe_ref import densify, is_moe

    return _empty_ffns(densify(dense_branches(hf)) if is_moe(hf) else hf)
