"""Which parameter entries a neuron owns, as boolean masks over the model's real parameters.

A neuron ``(l, i)`` owns every MLP weight entry indexed by it: its input column ``W_in[:, i]``,
its gate column ``W_gate[:, i]`` where the MLP is gated, its input and gate bias entries where
there are any, and its output row ``W_out[i, :]`` (TransformerLens' ``[d_model, d_mlp]`` /
``[d_mlp, d_model]`` convention). ``b_out`` is shared by all neurons and owned by none.

Which parameter stores each of them, and on which axis, comes from
:func:`capinterp.arch.neuron_weights.neuron_params` (read from the modules, for every family:
``nn.Linear`` ``[out, in]``, GPT-2's ``Conv1D`` ``[in, out]``, Phi-3's fused gate+up through
the bridge's split views), so masks are built on the tensors the optimizer really updates.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from jaxtyping import Bool
from torch import Tensor

from capinterp.arch.neuron_weights import neuron_params
from capinterp.core.params import count_entries
from capinterp.core.protocol import Model
from capinterp.units.neurons import NeuronSet

__all__ = ["NeuronSlice", "count_params", "neuron_masks", "neuron_slices", "zero_neurons"]


@dataclass(frozen=True)
class NeuronSlice:
    """One weight family of one layer: parameter ``name`` holds layer ``layer``'s ``kind`` on ``axis``."""

    layer: int
    kind: str  # "W_in", "W_gate", "b_in", "b_gate" or "W_out"
    name: str  # the parameter's name in ``model.named_parameters()``
    axis: int  # the parameter's d_mlp axis


def neuron_slices(model: Model) -> list[NeuronSlice]:
    """Every (layer, weight family) whose entries belong to single neurons, on real parameters.

    Raises :class:`~capinterp.arch.family.UnsupportedFamily` when a projection is not stored in a
    registered parameter (its gradient could not be masked) or its neuron axis is not ``d_mlp``.
    """
    return [NeuronSlice(p.layer, p.kind, p.name, p.axis) for p in neuron_params(model)]


def neuron_masks(model: Model, neurons: NeuronSet) -> dict[str, Bool[Tensor, ...]]:
    """``{parameter name: bool mask}``: True on the entries owned by a neuron of ``neurons``.

    Only parameters holding at least one neuron family appear; masks live on each parameter's
    device and have its shape.
    """
    masks: dict[str, torch.Tensor] = {}
    for s in neuron_params(model):
        mask = masks.setdefault(s.name, torch.zeros_like(s.param, dtype=torch.bool))
        idx = neurons.mask[s.layer].nonzero().flatten().to(s.param.device)
        if idx.numel():
            mask[s.entries(idx)] = True
    return masks


@torch.no_grad()
def zero_neurons(model: Model, neurons: NeuronSet) -> int:
    """Set every parameter entry owned by ``neurons`` to 0 in place; return how many entries.

    With ``W_in``, ``W_gate`` and their biases zeroed the neuron's activation is ``act(0) * 0 = 0``,
    and with ``W_out`` zeroed it writes nothing: the model behaves as under :func:`capinterp.erase`
    without any hook (so it stays erased through training and evaluation).
    """
    params = dict(model.named_parameters())
    n = 0
    for name, mask in neuron_masks(model, neurons).items():
        params[name].masked_fill_(mask, 0.0)
        n += int(mask.sum())
    return n


def count_params(model: Model) -> int:
    """Number of distinct parameter entries (tied weights and views of a fused weight counted once)."""
    return count_entries(model.parameters())
