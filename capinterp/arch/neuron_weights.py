"""Where a neuron's weights live: the down projection of a layer and every parameter indexed by neuron.

Neuron ``(l, i)`` is input ``i`` of layer ``l``'s down projection (``c_proj`` / ``fc_out`` /
``dense_4h_to_h`` / ``fc2`` / ``down_proj`` / ...). It owns the MLP entries indexed by it: its
up-projection row/column and bias entry (``W_in``, ``b_in``), its gate's (``W_gate``,
``b_gate``) in a gated MLP, and its value vector, entry ``i`` of the down projection's input
axis (``W_out``). The down projection's bias is shared by all neurons and owned by none.

Everything here is read from the model, not from a family name: a ``TransformerBridge`` MLP
names its projections ``in`` / ``gate`` / ``out`` for every family and wraps the transformers
module (``original_component``); a module's orientation comes from the module itself:
``nn.Linear`` (and subclasses such as Falcon's) stores ``[out_features, in_features]``,
transformers' ``Conv1D`` (GPT-2) stores ``[in, out]`` (``nx`` / ``nf``). A fused gate+up
projection (Phi-3's ``gate_up_proj``) is served through the bridge's split ``gate`` / ``in``
Linears, whose parameters are views of the fused one (so writing them writes the model's own).
Anything that cannot be related to ``d_mlp`` unambiguously raises ``UnsupportedFamily``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from capinterp.arch.family import UnsupportedFamily
from capinterp.arch.linear import is_conv1d
from capinterp.arch.weights import down_projection, value_weight
from capinterp.core.protocol import Model

__all__ = [
    "KINDS",
    "NeuronParam",
    "down_weight",
    "neuron_params",
    "value_rows",
]

# kind -> (bridge MLP component, attribute of its module, which side of the module d_mlp is on)
_KINDS: dict[str, tuple[str, str, str]] = {
    "W_in": ("in", "weight", "out"),
    "W_gate": ("gate", "weight", "out"),
    "b_in": ("in", "bias", "out"),
    "b_gate": ("gate", "bias", "out"),
    "W_out": ("out", "weight", "in"),
}
KINDS: tuple[str, ...] = tuple(_KINDS)


@dataclass(frozen=True, eq=False)
class NeuronParam:
    """Parameter ``name`` (``param``) holds layer ``layer``'s ``kind`` with neurons on axis ``axis``.

    On a mixture-of-experts layer a neuron's entries are spread over the experts' 3-D weights:
    ``where`` maps flat neuron indices to the index of their entries
    (:func:`capinterp.arch.expert_weights.owned_entries`) and ``axis`` is -1.
    """

    layer: int
    kind: str  # one of KINDS (MoE adds "W_gate_up" / "b_gate_up": fused gate and up rows)
    name: str  # the parameter's name in ``model.named_parameters()``
    param: torch.nn.Parameter
    axis: int  # the parameter's d_mlp axis (-1: see ``where``)
    where: Callable[[torch.Tensor], tuple] | None = None

    def entries(self, neurons: torch.Tensor) -> tuple:
        """Index (for ``param[...]``) of the entries owned by the layer's neurons ``neurons`` (1-D long)."""
        if self.where is not None:
            return self.where(neurons)
        return (slice(None),) * self.axis + (neurons,)


def _family_name(model: Model) -> str:
    fam = getattr(model, "capinterp_family", None)
    return str(getattr(fam, "name", None) or type(getattr(model, "original_model", model)).__name__)


def _module(model: Model, layer: int, component: str) -> torch.nn.Module | None:
    """The transformers module behind the bridge MLP's ``component`` (``in`` / ``gate`` / ``out``)."""
    comp = getattr(model.blocks[layer].mlp, component, None)
    if comp is None:
        return None
    mod = getattr(comp, "original_component", None)
    return mod if isinstance(mod, torch.nn.Module) else None


def _out_axis(module: torch.nn.Module, weight: torch.Tensor) -> int:
    """The axis of a 2-D projection weight that indexes the module's outputs."""
    if isinstance(module, torch.nn.Linear) or (
        getattr(module, "out_features", None) == weight.shape[0] and getattr(module, "in_features", None) is not None
    ):
        return 0  # [out_features, in_features]
    if is_conv1d(module):
        return 1  # transformers Conv1D: [nx (in), nf (out)]
    raise UnsupportedFamily(
        f"{type(module).__name__} stores a {tuple(weight.shape)} weight that is neither nn.Linear-like "
        "(out_features, in_features) nor Conv1D-like (nx, nf): its neuron axis is unknown"
    )


def _axis(module: torch.nn.Module, p: torch.Tensor, side: str) -> int:
    if p.dim() == 1:
        return 0
    out = _out_axis(module, p)
    return out if side == "out" else 1 - out


def down_weight(model: Model, layer: int) -> tuple[torch.Tensor, int]:
    """The down projection's weight of ``layer`` (the model's own parameter) and its neuron axis:
    1 for ``nn.Linear`` (``[d_model, d_mlp]``), 0 for ``Conv1D`` (``[d_mlp, d_model]``)
    (:func:`capinterp.arch.weights.value_weight`)."""
    return value_weight(model, layer)


def value_rows(model: Model, layer: int) -> torch.Tensor:
    """The value vectors of ``layer`` as ``[d_mlp, d_model]``: a view of the down projection's
    weight, so in-place writes (under ``torch.no_grad()``) edit the model itself."""
    return down_projection(model, layer).values()


def neuron_params(model: Model, layers: Any = None) -> list[NeuronParam]:
    """Every parameter entry family indexed by neurons, per layer (``layers``: all by default).

    Raises ``UnsupportedFamily`` when a projection's parameter is not one of the model's
    registered parameters (its gradient could not be masked) or its neuron axis is not
    ``d_mlp`` wide.
    """
    d_mlp = int(model.cfg.d_mlp)
    names = {id(p): n for n, p in model.named_parameters()}
    if getattr(model, "capinterp_experts", None):
        return _expert_params(model, names, layers)
    out: list[NeuronParam] = []
    for layer in range(int(model.cfg.n_layers)) if layers is None else layers:
        down_weight(model, layer)  # every layer must have a down projection
        for kind, (component, attr, side) in _KINDS.items():
            mod = _module(model, layer, component)
            p = getattr(mod, attr, None) if mod is not None else None
            if not isinstance(p, torch.Tensor):
                continue
            where = f"layer {layer}'s {kind} ({type(mod).__name__}.{attr} {tuple(p.shape)})"
            if id(p) not in names:
                raise UnsupportedFamily(f"{_family_name(model)}: {where} is not a parameter of the model")
            axis = _axis(mod, p, side)  # type: ignore[arg-type]
            if p.shape[axis] != d_mlp:
                raise UnsupportedFamily(f"{_family_name(model)}: {where} has {p.shape[axis]} neurons, not {d_mlp}")
            out.append(NeuronParam(layer, kind, names[id(p)], p, axis))  # type: ignore[arg-type]
    return out


def _expert_params(model: Model, names: dict[int, str], layers: Any) -> list[NeuronParam]:
    from capinterp.arch.expert_weights import owned_entries
    from capinterp.arch.experts import expert_block

    out: list[NeuronParam] = []
    for layer in range(int(model.cfg.n_layers)) if layers is None else layers:
        for kind, attr, p, where in owned_entries(expert_block(model, layer)):
            if id(p) not in names:
                raise UnsupportedFamily(
                    f"{_family_name(model)}: layer {layer}'s {attr} is not a parameter of the model"
                )
            out.append(NeuronParam(layer, kind, names[id(p)], p, -1, where))  # type: ignore[arg-type]
    return out
