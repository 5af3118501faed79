"""Reference side of the intervention checks: the plain transformers model, its MLP modules found by
their transformers names (written here by hand, independently of capinterp's own lookup)."""

from __future__ import annotations

import functools
import re
from typing import Any

import torch

from capinterp.arch.linear import is_conv1d, linear_layout
from capinterp.arch.tiny import tiny_hf
from capinterp.testing.family_checks._hf import (
    DOWN_NAMES,
    FFN_NAMES,
    FUSED_NAMES,
    GATE_NAMES,
    UP_NAMES,
    branch_down,
    is_matrix,
    outside_shared,
)

__all__ = ["Mlp", "layer_widths", "mlps", "neuron_entries", "plain", "plain_params"]


@functools.lru_cache(maxsize=1)
def plain(family: str) -> Any:
    """A fresh, unwrapped transformers model of the family (same seed as the bridge's). Cached: do
    not modify; :func:`capinterp.arch.tiny.tiny_hf` gives one to modify. Mixture-of-experts
    models are made dense (:func:`._moe_ref.densify`)."""
    from capinterp.testing.family_checks._one_sublayer_ref import reference_model

    hf = tiny_hf(family)[0]
    return reference_model(hf)


class Mlp:
    """One layer's FFN in the plain model: ``(name, module)`` of its down, up, gate and fused projections."""

    def __init__(self, layer: torch.nn.Module, prefix: str):
        branches = branch_down(layer)  # a densified Gemma 4 MoE layer (._branch_ref)
        if branches is not None:
            self.down, self.up, self.gate, self.fused = (f"{prefix}._ref_down", branches), None, None, None
            return
        ffn = outside_shared(  # a densified MoE's down_proj covers its shared expert
            [
                (name, mod)
                for name, mod in layer.named_modules()
                if is_matrix(mod) and name.split(".")[-1] in FFN_NAMES
                if not any(k in part for part in name.split(".") for k in ("attn", "attention"))  # GPT-2's c_proj
            ]
        )
        found: dict[str, list[tuple[str, torch.nn.Module]]] = {"down": [], "up": [], "gate": [], "fused": []}
        for name, mod in ffn:
            for role, names in (("down", DOWN_NAMES), ("up", UP_NAMES), ("gate", GATE_NAMES), ("fused", FUSED_NAMES)):
                if name.split(".")[-1] in names:
                    found[role].append((f"{prefix}.{name}", mod))
        from capinterp.testing.family_checks._moe_ref import ExpertsDown

        dense_moe = len(found["down"]) == 1 and isinstance(found["down"][0][1], ExpertsDown)  # no up / gate modules
        if not dense_moe and (
            len(found["down"]) != 1 or len(found["up"]) + len(found["fused"]) != 1 or len(found["gate"]) > 1
        ):
            raise AssertionError(f"plain model layer {prefix}: cannot find its FFN projections: {found}")
        self.down = found["down"][0]
        self.up = found["up"][0] if found["up"] else None
        self.gate = found["gate"][0] if found["gate"] else None
        self.fused = found["fused"][0] if found["fused"] else None


def _layers(hf: Any) -> tuple[str, torch.nn.ModuleList]:
    n = hf.config.get_text_config().num_hidden_layers
    lists = [(n_, m) for n_, m in hf.named_modules() if isinstance(m, torch.nn.ModuleList) and len(m) == n]
    name, mods = max(lists, key=lambda nm: sum(p.numel() for p in nm[1].parameters()))
    return name, mods


def mlps(hf: Any) -> list[Mlp]:
    """Every layer's :class:`Mlp`, in order."""
    name, layers = _layers(hf)
    return [Mlp(layer, f"{name}.{i}") for i, layer in enumerate(layers)]


# NemotronH's modules as capinterp renames them (capinterp.arch.one_sublayer, documented): each layer's mixer
# or FFN is "mixer" in transformers, its norm "norm"; the FFN capinterp adds to a mixer layer has no entries
_SPLIT_NAMES = re.compile(r"(\.layers\.\d+\.)(?:(mamba|self_attn|mlp)|(input_layernorm|pre_ff_layernorm))\.")


def plain_params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """``{transformers name: parameter}`` of a transformers model, also one a bridge wraps
    (its wrapper segments ``._original_component`` removed; NemotronH's renamed modules by their
    transformers names)."""
    out: dict[str, torch.Tensor] = {}
    for n, p in model.named_parameters():
        n = n.replace("._original_component", "").replace("_original_component.", "")
        if getattr(getattr(model, "config", None), "model_type", None) == "nemotron_h":
            if not p.numel():  # the FFN with no neurons capinterp gives a mixer layer
                continue
            n = _SPLIT_NAMES.sub(lambda m: m.group(1) + ("mixer." if m.group(2) else "norm."), n)
        out[n] = p
    return out


def neuron_entries(hf: Any, neurons: dict[int, list[int]]) -> dict[str, torch.Tensor]:
    """``{parameter name: bool mask}`` of the entries the given neurons own, by hand: up / gate rows
    (columns for Conv1D) and bias entries, the fused gate+up rows ``i`` and ``d_mlp + i``, and the
    down projection's input column (row for Conv1D)."""
    from capinterp.testing.family_checks._moe_ref import moe_layers, moe_neuron_entries

    moe = moe_layers(hf)  # MoE layers (a model mixing dense and MoE layers keeps its dense MLPs)
    expert_masks = moe_neuron_entries(hf, {l: idx for l, idx in neurons.items() if l in moe})
    params = plain_params(hf)
    masks = {n: torch.zeros_like(p, dtype=torch.bool) for n, p in params.items()}
    for layer, mlp in enumerate(mlps(hf)):
        idx = torch.tensor(neurons.get(layer, []) if layer not in moe else [], dtype=torch.long)
        if not idx.numel():
            continue
        for proj in (mlp.up, mlp.gate):
            if proj is None:
                continue
            name, mod = proj
            masks[name + ".weight"].index_fill_(1 if is_conv1d(mod) else 0, idx, True)
            if getattr(mod, "bias", None) is not None:
                masks[name + ".bias"][idx] = True
        if mlp.fused is not None:
            name, mod = mlp.fused
            d_mlp = params[name + ".weight"].shape[0] // 2
            masks[name + ".weight"][torch.cat([idx, idx + d_mlp])] = True
            if getattr(mod, "bias", None) is not None:
                masks[name + ".bias"][torch.cat([idx, idx + d_mlp])] = True
        name, mod = mlp.down
        masks[name + ".weight"].index_fill_(0 if is_conv1d(mod) else 1, idx, True)
    return {**{n: m for n, m in masks.items() if bool(m.any())}, **expert_masks}


def layer_widths(hf: Any) -> list[int]:
    """Each layer's number of neurons: the inputs its down projection reads (an MoE layer's
    densified one: every expert's neurons and the shared expert's; a dense layer of a model that
    mixes dense and MoE layers has fewer)."""
    out = []
    for mlp in mlps(hf):
        out.append(int(linear_layout(mlp.down[1]).shape[1]))  # [out, in]: an MoE layer's ExpertsDown, Conv1D-like too
    return out
