"""NemotronH's layers, one sublayer each, as the pre-norm blocks the bridge maps on every other hybrid.

A NemotronH layer is ``x + mixer(norm(x))``, its mixer one of a Mamba-2 mixer, attention without
positions, a plain ReLU-squared MLP or a mixture of experts (``config.layers_block_type``): a layer
has attention, Mamba or an FFN, never two. capinterp's neuron axis has a row per layer, and its
methods read the bridge's block names (``ln1``, ``attn``, ``mixer``, ``ln2``, ``mlp``). Before the
bridge wraps the model, :func:`split` gives each layer those names, by kind:

* a mixer layer: ``input_layernorm`` and ``self_attn`` or ``mamba`` (its norm and mixer), then an
  ``mlp`` with no neurons (:class:`EmptyFFN`: 0 neurons wide, its output 0) on the residual after
  the mixer;
* an FFN layer: ``pre_ff_layernorm`` and ``mlp`` (its norm and FFN).

The layer's forward computes exactly what transformers' does (the empty FFN adds 0; the load-time
logits check compares them). The mixer layers then have 0 neurons on the axis (``Family.layer_widths``,
the padding machinery of :mod:`capinterp.arch.experts`): no method ranks, erases or edits a
neuron there. The module names change, so the transformers model's ``state_dict`` keys do too
(``layers.{l}.mixer.*`` becomes ``layers.{l}.mamba.*``, ``self_attn.*`` or ``mlp.*``): save a
checkpoint from a freshly loaded transformers model, not from the one capinterp serves.
"""

from __future__ import annotations

import types
import warnings
from typing import Any

import torch
from torch import Tensor

__all__ = ["EmptyFFN", "is_split", "split"]

_MAMBA, _ATTENTION = "linear_attention", "full_attention"  # transformers' names of NemotronH's mixers


class EmptyFFN(torch.nn.Module):
    """A plain MLP with no neurons (``up_proj`` ``d_model -> 0``, ``down_proj`` ``0 -> d_model``): its output
    is 0. It stands in a layer that has no FFN, so the neuron axis has a row there, of width 0."""

    def __init__(self, d_model: int, like: Tensor, act_fn: Any):
        super().__init__()
        with warnings.catch_warnings():  # initializing zero-element weights: nothing to initialize
            warnings.simplefilter("ignore")
            self.up_proj = torch.nn.Linear(d_model, 0, bias=False, device=like.device, dtype=like.dtype)
            self.down_proj = torch.nn.Linear(0, d_model, bias=False, device=like.device, dtype=like.dtype)
        self.act_fn = act_fn

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(self.act_fn(self.up_proj(x)))


def is_split(hf_model: Any) -> bool:
    return bool(getattr(hf_model, "capinterp_split", False))


def split(hf_model: Any) -> None:
    """Rename each NemotronH layer's modules by kind (module docstring), in place; once per model."""
    if is_split(hf_model):
        return
    cfg = hf_model.config
    from transformers.activations import ACT2FN

    for layer in hf_model.model.layers:
        kind, norm, mixer = layer.block_type, layer.norm, layer.mixer
        del layer.norm, layer.mixer
        if kind in (_MAMBA, _ATTENTION):
            layer.input_layernorm = norm
            layer.add_module("mamba" if kind == _MAMBA else "self_attn", mixer)
            layer.mlp = EmptyFFN(int(cfg.hidden_size), norm.weight, ACT2FN[cfg.mlp_hidden_act])
        else:
            layer.pre_ff_layernorm, layer.mlp = norm, mixer
        layer.forward = types.MethodType(_forward, layer)
    hf_model.capinterp_split = True


def _normed(norm: Any, x: Tensor) -> Tensor:
    return norm(x.to(dtype=norm.weight.dtype))  # as transformers' layer: the norm's dtype in


def _forward(
    self: Any,
    hidden_states: Tensor,
    past_key_values: Any = None,
    attention_mask: Tensor | None = None,
    position_ids: Tensor | None = None,
    use_cache: bool | None = False,
    **kwargs: Any,
) -> Tensor:
    """A split NemotronH layer: transformers' ``residual + mixer(norm(x))``, under the new names."""
    if self.block_type not in (_MAMBA, _ATTENTION):
        return hidden_states + self.mlp(_normed(self.pre_ff_layernorm, hidden_states))
    h = _normed(self.input_layernorm, hidden_states)
    if self.block_type == _MAMBA:
        h = self.mamba(h, cache_params=past_key_values, attention_mask=attention_mask, **kwargs)
    else:
        h, _ = self.self_attn(
            hidden_states=h,
            past_key_values=past_key_values,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=use_cache,
            **kwargs,
        )
    hidden_states = hidden_states + h
    return hidden_states + self.mlp(hidden_states)
