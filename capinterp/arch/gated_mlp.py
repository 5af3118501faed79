"""FFN modules as capinterp reads them: gated, plain, and views of gated ones named otherwise.

Gated MLPs as transformers names them (``gate_proj``, ``up_proj``, ``down_proj``, ``act_fn``), plain
ones (``up_proj``, ``down_proj``, ``act_fn``: NemotronH's ReLU-squared MLPs and shared experts), and
views of the gated ones that name them otherwise, for :mod:`capinterp.arch.experts`: LFM2-MoE's dense layers
keep the original Llama's ``w1`` / ``w3`` / ``w2``; Granite 4.0's shared MLP fuses gate and up into one
``input_linear``. A view's attributes are the module's own parameters (or views of them), so reads and
writes reach the model; :func:`module_of` gives the module behind a view."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

__all__ = [
    "FusedNames",
    "LlamaNames",
    "activation",
    "fused_gated",
    "gated_mlp_neurons",
    "input_projections",
    "is_mlp",
    "mlp_neurons",
    "module_of",
    "named_gated",
    "unwrap",
]


def unwrap(module: Any) -> Any:
    """The transformers module behind bridge wrappers."""
    while isinstance(getattr(module, "original_component", None), torch.nn.Module):
        module = module.original_component
    return module


def activation(mlp: Any) -> Any:
    """A transformers gated MLP's activation module (``act_fn``; Llama 4 calls it ``activation_fn``)."""
    return getattr(mlp, "act_fn", None) or getattr(mlp, "activation_fn", None)


class LlamaNames:
    """A gated MLP that keeps the original Llama's names (LFM2-MoE's dense layers: ``w1`` gate, ``w3`` up,
    ``w2`` down, SiLU inside its forward), seen under transformers' usual ones. Its attributes are the
    module's own submodules, so reads and writes reach the model; calling it calls the module. The
    activation is taken as SiLU where the module names none: the load-time check of
    :mod:`capinterp.arch.experts` refuses the layer if the module computes anything else."""

    def __init__(self, mlp: torch.nn.Module):
        self.module = mlp
        self.gate_proj, self.up_proj, self.down_proj = mlp.w1, mlp.w3, mlp.w2
        self.act_fn = getattr(mlp, "act_fn", None) or torch.nn.functional.silu

    def __call__(self, x: Tensor) -> Tensor:
        return self.module(x)


def named_gated(mlp: Any) -> Any:
    """``mlp``, or its :class:`LlamaNames` view where its projections are called ``w1`` / ``w2`` / ``w3``."""
    if not hasattr(mlp, "down_proj") and all(
        isinstance(unwrap(getattr(mlp, k, None)), torch.nn.Linear) for k in ("w1", "w2", "w3")
    ):
        return LlamaNames(mlp)
    return mlp


class _Half:
    """One half (gate or up) of a fused ``[gate | up]`` Linear without bias, as a Linear would be read:
    ``weight`` a view of the fused weight's rows (writes reach it), calling it projects."""

    def __init__(self, fused: torch.nn.Linear, half: int):
        self.fused, self.half = fused, half

    @property
    def weight(self) -> Tensor:
        return self.fused.weight.chunk(2, dim=0)[self.half]

    @property
    def in_features(self) -> int:
        return int(self.fused.in_features)

    def __call__(self, x: Tensor) -> Tensor:
        return torch.nn.functional.linear(x, self.weight)


class FusedNames:
    """A gated MLP with one fused ``input_linear`` (rows: gate half, then up half) and ``output_linear``
    (Granite 4.0's shared MLP), seen under transformers' usual names; ``fused`` is the fused Linear
    (the parameter its neurons' gate and up rows live in). Not callable: once served, the module's own
    forward returns 0 (the MoE block computes its neurons)."""

    def __init__(self, mlp: Any):
        self.module, self.fused = mlp, mlp.input_linear
        self.gate_proj, self.up_proj, self.down_proj = _Half(self.fused, 0), _Half(self.fused, 1), mlp.output_linear
        self.act_fn = mlp.activation


def fused_gated(mlp: Any) -> bool:
    return all(
        isinstance(unwrap(getattr(mlp, k, None)), torch.nn.Linear) and unwrap(getattr(mlp, k)).bias is None
        for k in ("input_linear", "output_linear")
    ) and callable(getattr(mlp, "activation", None))


def gated_mlp_neurons(mlp: Any, x: Tensor) -> Tensor:
    """``act(gate_proj(x)) * up_proj(x)``: the neurons of a transformers gated MLP (a shared expert,
    or a dense layer between expert layers); where the MLP clamps them first (DeepSeek-V4's
    ``limit``, the config's ``swiglu_limit``), the gate at ``limit`` and the up projection at ``+-limit``."""
    gate, up = mlp.gate_proj(x), mlp.up_proj(x)
    limit = getattr(mlp, "limit", None)
    if isinstance(limit, (int, float)) and not isinstance(limit, bool):
        gate, up = gate.clamp(max=limit), up.clamp(min=-limit, max=limit)
    return activation(mlp)(gate) * up


def _linear(mod: Any) -> bool:
    """A Linear layer (or one like it: ``in_features`` and a 2-D ``weight``), bridge wrappers looked through."""
    mod = unwrap(mod)
    weight = getattr(mod, "weight", None)
    return isinstance(getattr(mod, "in_features", None), int) and isinstance(weight, Tensor) and weight.dim() == 2


def is_mlp(mlp: Any) -> bool:
    """A gated MLP, or a plain one: ``up_proj`` and ``down_proj`` Linears (``gate_proj`` too where it has
    one) and an activation. A projection that is no Linear (another layout of its weight) is no MLP here."""
    names = ("gate_proj", "up_proj", "down_proj") if hasattr(mlp, "gate_proj") else ("up_proj", "down_proj")
    return all(_linear(getattr(mlp, k, None)) for k in names) and callable(activation(mlp))


def mlp_neurons(mlp: Any, x: Tensor) -> Tensor:
    """The neurons of a gated MLP (:func:`gated_mlp_neurons`) or of a plain one, ``act(up_proj(x))``."""
    return gated_mlp_neurons(mlp, x) if hasattr(mlp, "gate_proj") else activation(mlp)(mlp.up_proj(x))


def input_projections(mlp: Any) -> list[tuple[str, str]]:
    """``(kind, attribute)`` of the projections whose rows a neuron owns on its input side: gate and
    up (``W_gate``, ``W_in``), or up alone in a plain MLP."""
    return [("W_gate", "gate_proj"), ("W_in", "up_proj")] if hasattr(mlp, "gate_proj") else [("W_in", "up_proj")]


def module_of(mlp: Any) -> Any:
    """The transformers module behind a :class:`LlamaNames` or :class:`FusedNames` view (``mlp`` itself otherwise)."""
    return mlp.module if isinstance(mlp, (LlamaNames, FusedNames)) else mlp
