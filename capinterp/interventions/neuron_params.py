"""Which parameter entries a neuron owns, as boolean masks over the model's real parameters.

A neuron ``(l, i)`` owns every MLP weight entry indexed by it: its input column ``W_in[:, i]``,
its gate column ``W_gate[:, i]`` where the MLP is gated, its input bias ``b_in[i]`` where there
is one, and its output row ``W_out[i, :]`` (TransformerLens' ``[d_model, d_mlp]`` /
``[d_mlp, d_model]`` convention). ``b_out`` is shared by all neurons and owned by none.

On a ``TransformerBridge`` the ``W_in`` / ``W_gate`` / ``W_out`` properties are *transposed
views* of the wrapped ``nn.Linear`` weights (``up_proj.weight`` is ``[d_mlp, d_model]``, so a
neuron is a row there, and a column of ``down_proj.weight``). :func:`neuron_slices` finds, for
each property, the parameter that stores it (same storage) and the parameter's own ``d_mlp``
axis from the view's strides, so masks are built on the tensors the optimizer really updates.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from jaxtyping import Bool
from torch import Tensor

from capinterp.core.model import neuron_shape
from capinterp.units.neurons import NeuronSet

__all__ = ["NeuronSlice", "count_params", "neuron_masks", "neuron_slices", "zero_neurons"]

# TransformerLens property -> the axis that indexes neurons, in TL's own layout.
_TL_NEURON_AXIS = {"W_in": 1, "W_gate": 1, "b_in": 0, "W_out": 0}


@dataclass(frozen=True)
class NeuronSlice:
    """One weight family of one layer: parameter ``name`` holds layer ``layer``'s ``kind`` on ``axis``."""

    layer: int
    kind: str  # "W_in", "W_gate", "b_in" or "W_out"
    name: str  # the parameter's name in ``model.named_parameters()``
    axis: int  # the parameter's d_mlp axis


def _storage(t: torch.Tensor) -> tuple[int, int]:
    return t.untyped_storage().data_ptr(), int(t.storage_offset())


def _axis(view: torch.Tensor, param: torch.Tensor, tl_axis: int, what: str) -> int:
    """The parameter's neuron axis, given the TL-layout tensor ``view`` that shares its storage."""
    if view.dim() == 1:
        return 0
    if tuple(view.shape) == tuple(param.shape) and view.stride() == param.stride():
        return tl_axis
    if tuple(view.shape) == tuple(param.shape[::-1]) and view.stride() == param.stride()[::-1]:
        return 1 - tl_axis
    raise RuntimeError(f"{what}: cannot relate its layout {tuple(view.shape)} to its parameter {tuple(param.shape)}")


def neuron_slices(model) -> list[NeuronSlice]:
    """Every (layer, weight family) whose entries belong to single neurons, on real parameters.

    Raises RuntimeError when a family exists but no parameter stores it (e.g. a bridge that
    computes ``W_in`` as a copy), since its gradient could not be masked.
    """
    n_layers, d_mlp = neuron_shape(model)
    names = {id(p): n for n, p in model.named_parameters()}
    out: list[NeuronSlice] = []
    for layer in range(n_layers):
        mlp = model.blocks[layer].mlp
        params = list(mlp.parameters())
        for kind, tl_axis in _TL_NEURON_AXIS.items():
            try:
                view = getattr(mlp, kind)
            except (AttributeError, NotImplementedError, KeyError):
                continue
            if not isinstance(view, torch.Tensor):
                continue
            what = f"blocks.{layer}.mlp.{kind}"
            owner = [p for p in params if _storage(p) == _storage(view) and p.numel() == view.numel()]
            if not owner:
                raise RuntimeError(f"{what} is not stored in any parameter of the MLP; cannot mask its gradient")
            axis = _axis(view, owner[0], tl_axis, what)
            if owner[0].shape[axis] != d_mlp:
                raise RuntimeError(f"{what}: axis {axis} of {tuple(owner[0].shape)} is not d_mlp={d_mlp}")
            out.append(NeuronSlice(layer, kind, names[id(owner[0])], axis))
    if not out:
        raise RuntimeError("found no MLP weights indexed by neurons (W_in / W_gate / b_in / W_out)")
    return out


def neuron_masks(model, neurons: NeuronSet) -> dict[str, Bool[Tensor, ...]]:
    """``{parameter name: bool mask}``: True on the entries owned by a neuron of ``neurons``.

    Only parameters holding at least one neuron family appear; masks live on each parameter's
    device and have its shape.
    """
    params = dict(model.named_parameters())
    masks: dict[str, torch.Tensor] = {}
    for s in neuron_slices(model):
        p = params[s.name]
        mask = masks.setdefault(s.name, torch.zeros_like(p, dtype=torch.bool))
        idx = neurons.mask[s.layer].nonzero().flatten().to(p.device)
        if idx.numel():
            mask.index_fill_(s.axis, idx, True)
    return masks


@torch.no_grad()
def zero_neurons(model, neurons: NeuronSet) -> int:
    """Set every parameter entry owned by ``neurons`` to 0 in place; return how many entries.

    With ``W_in``, ``W_gate`` and ``b_in`` zeroed the neuron's activation is ``act(0) * 0 = 0``,
    and with ``W_out`` zeroed it writes nothing: the model behaves as under :func:`capinterp.erase`
    without any hook (so it stays erased through training and evaluation).
    """
    params = dict(model.named_parameters())
    n = 0
    for name, mask in neuron_masks(model, neurons).items():
        params[name].masked_fill_(mask, 0.0)
        n += int(mask.sum())
    return n


def count_params(model) -> int:
    """Number of distinct parameter entries (tied weights counted once)."""
    return sum(p.numel() for p in model.parameters())
