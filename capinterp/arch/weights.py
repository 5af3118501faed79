"""The MLP down projection of a layer: the neurons' value vectors, in one orientation on every family.

A neuron ``(l, i)`` writes ``a_i * W_out[l][i]`` into the residual stream; ``W_out[l]`` is the weight
of layer ``l``'s down projection (``down_proj``, ``c_proj``, ``fc_out``, ``dense_4h_to_h``, ``fc2``,
``out_proj``, ... whatever the family calls it: the bridge exposes it as ``blocks.l.mlp.out``).
Its storage differs by family: ``nn.Linear`` (and subclasses such as Falcon's ``FalconLinear``)
keeps ``[d_model, d_mlp]``, transformers' ``Conv1D`` (GPT-2) and TransformerLens' ``W_out``
keep ``[d_mlp, d_model]``. :func:`down_projection` hides that: :meth:`DownProjection.values`
is always ``[d_mlp, d_model]`` (a view of the live weight), :meth:`DownProjection.write` /
:meth:`DownProjection.add` write back in the same orientation. Parallel-block families need
nothing more: their MLP reads the same residual as the attention, but its down projection is
the same kind of module. :func:`is_conv1d` and :func:`linear_layout` are the one place that knows
``Conv1D``'s layout: everything else that reads a projection's weight (the family record, the
neuron weights, the family checks' references) goes through them.

A model whose down projection cannot be found, or is not ``d_mlp`` wide along one side, is an
:class:`~capinterp.arch.family.UnsupportedFamily` naming the family and the module found.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from capinterp.arch.expert_weights import ExpertValues
from capinterp.arch.experts import DenseBlock, expert_block
from capinterp.arch.family import UnsupportedFamily, family_of
from capinterp.arch.linear import is_conv1d
from capinterp.core.protocol import Model

__all__ = ["DownProjection", "down_projection", "value_weight"]


@dataclass(frozen=True)
class DownProjection:
    """Layer ``layer``'s down-projection weight ``weight``; ``neuron_dim`` is the axis that indexes neurons."""

    layer: int
    weight: Tensor  # the live parameter (written in place)
    neuron_dim: int  # 0: stored [d_mlp, d_model] (Conv1D, W_out); 1: stored [d_model, d_mlp] (nn.Linear)

    def values(self) -> Float[Tensor, "d_mlp d_model"]:
        """The value vectors, one row per neuron: a view of the weight (no copy)."""
        return self.weight if self.neuron_dim == 0 else self.weight.T

    def apply(self, keys: Float[Tensor, "... d_mlp"]) -> Float[Tensor, "... d_model"]:
        """``keys @ values()`` in float32: the projection's output without its bias."""
        return keys.float() @ self.values().float().to(keys.device)

    @torch.no_grad()
    def write(self, values: Float[Tensor, "d_mlp d_model"]) -> None:
        """Replace the whole weight by ``values`` (``[d_mlp, d_model]``), in the weight's dtype."""
        self.values().copy_(values.to(device=self.weight.device, dtype=self.weight.dtype))

    @torch.no_grad()
    def write_rows(self, neurons: Tensor, rows: Float[Tensor, "k d_model"]) -> None:
        """Replace the value vectors of ``neurons`` (1-D indices) by ``rows``, in the weight's dtype."""
        self.values()[neurons.to(self.weight.device)] = rows.to(device=self.weight.device, dtype=self.weight.dtype)

    @torch.no_grad()
    def add(self, delta: Float[Tensor, "d_mlp d_model"]) -> None:
        """``W += delta`` (``[d_mlp, d_model]``), summed in float32 and stored in the weight's dtype."""
        v = self.values()
        v.copy_((v.float() + delta.to(device=v.device, dtype=torch.float32)).to(v.dtype))


def _stored_orientation(module: Any, weight: Tensor, d_mlp: int, d_model: int) -> int | None:
    if is_conv1d(module):
        return 0  # transformers' Conv1D: [in, out]
    if isinstance(module, torch.nn.Linear):
        return 1  # [out, in]
    if d_mlp != d_model:  # unknown module type: the shape decides when it can
        if tuple(weight.shape) == (d_mlp, d_model):
            return 0
        if tuple(weight.shape) == (d_model, d_mlp):
            return 1
    return None


def down_projection(model: Model, layer: int) -> DownProjection | ExpertValues:
    """Layer ``layer``'s down projection of a loaded model (bridge or TransformerLens-native); on a
    mixture-of-experts model, all its experts' (:class:`capinterp.arch.expert_weights.ExpertValues`)."""
    n_layers = len(model.blocks)
    if not isinstance(layer, int) or not 0 <= layer < n_layers:
        raise ValueError(f"layer must be an int in [0, {n_layers}), got {layer!r}")
    if getattr(model, "capinterp_experts", None):
        return ExpertValues(layer, expert_block(model, layer))
    d_mlp, d_model = int(model.cfg.d_mlp), int(model.cfg.d_model)
    mlp = model.blocks[layer].mlp
    out = getattr(getattr(mlp, "out", None), "original_component", None)
    if out is not None and isinstance(getattr(out, "weight", None), torch.Tensor):
        dim = _stored_orientation(out, out.weight, d_mlp, d_model)
        if dim is not None and out.weight.shape[dim] == d_mlp and out.weight.shape[1 - dim] == d_model:
            return DownProjection(layer, out.weight, dim)
        found = f"{type(out).__name__} with weight {tuple(out.weight.shape)}"
    elif isinstance(getattr(mlp, "W_out", None), torch.Tensor):
        return DownProjection(layer, mlp.W_out, 0)  # TransformerLens-native: [d_mlp, d_model]
    else:
        found = f"no down-projection weight on {type(mlp).__name__}"
    fam = family_of(model)
    raise UnsupportedFamily(
        f"{fam.name} ({fam.architecture}): the down projection of layer {layer} is not a [{d_mlp}, {d_model}] "
        f"weight capinterp can read ({found}); neuron value vectors cannot be read or written"
    )


def value_weight(model: Model, layer: int) -> tuple[Tensor, int]:
    """``(weight, neuron_dim)`` of :func:`down_projection`: the stored weight and its neuron axis.

    Not defined on mixture-of-experts layers (their value vectors sit in several 3-D weights):
    :class:`~capinterp.arch.family.UnsupportedFamily`; use :func:`down_projection`'s write / add.
    On a dense layer of a mixed dense / MoE model it is that layer's own down projection
    (``nn.Linear``, ``neuron_dim`` 1), whose neuron axis holds only the layer's real neurons: the
    first ``weight.shape[1]`` of the model's ``d_mlp`` (the rest of the axis is padding, without weights).
    """
    proj = down_projection(model, layer)
    if isinstance(proj, ExpertValues) and isinstance(proj.spec, DenseBlock):
        down = proj.spec.block.down_proj
        return getattr(down, "original_component", down).weight, 1
    if isinstance(proj, ExpertValues):
        fam = family_of(model)
        raise UnsupportedFamily(
            f"{fam.name} ({fam.architecture}): editing a single stored down-projection weight is not defined "
            "for mixture-of-experts layers (each expert has its own); this method does not support experts yet"
        )
    return proj.weight, proj.neuron_dim
