"""Plain-transformers handles for the family checks' references: no capinterp code involved.

Module names are found by searching each decoder layer for the usual transformers names, so a
reference never goes through capinterp's own adapter (the thing it checks).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

__all__ = [
    "DOWN_NAMES",
    "FFN_NAMES",
    "FUSED_NAMES",
    "GATE_NAMES",
    "UP_NAMES",
    "attn_out",
    "attn_out_of",
    "branch_down",
    "decoder_layers",
    "hooked",
    "is_matrix",
    "mlp_down",
    "outside_shared",
    "subject_positions",
]

_ATTN = ("self_attn", "attn", "attention", "self_attention")
_ATTN_OUT = ("o_proj", "out_proj", "c_proj", "dense")
_MLP = ("mlp", "ffn", "feed_forward")
# transformers attribute names of the FFN projections, across the families of TINY_FAMILIES (LFM2 keeps
# the original Llama's w1 (gate), w3 (up), w2 (down); Granite 4.0's shared MLP: input_linear, output_linear;
# JetMoE's experts share those two names, but their weights are 3-D: only 2-D weights count)
DOWN_NAMES = ("c_proj", "fc_out", "dense_4h_to_h", "fc2", "down_proj", "w2", "output_linear")
UP_NAMES = ("c_fc", "fc_in", "dense_h_to_4h", "fc1", "up_proj", "w3")
GATE_NAMES = ("gate_proj", "w1")
FUSED_NAMES = ("gate_up_proj", "input_linear")  # Phi-3, Granite 4.0: rows [gate (d_mlp); up (d_mlp)]
FFN_NAMES = DOWN_NAMES + UP_NAMES + GATE_NAMES + FUSED_NAMES


def decoder_layers(hf: Any) -> torch.nn.ModuleList:
    """The first ModuleList with one entry per layer (``model.layers``, ``transformer.h``, ...)."""
    n = hf.config.get_text_config().num_hidden_layers
    for m in hf.modules():
        if isinstance(m, torch.nn.ModuleList) and len(m) == n:
            return m
    raise LookupError(f"no decoder layer list in {type(hf).__name__}")


# module-path parts of a densified MoE block's shared expert: its own down_proj (._moe_ref) stands for
# the whole layer's neurons, so searches for a layer's projections skip these paths, unless nothing else is
# found (Granite 4.0 without experts: the shared MLP is the layer's FFN)
SHARED_PATHS = ("shared_expert", "shared_mlp")


def is_matrix(module: torch.nn.Module) -> bool:
    w = getattr(module, "weight", None)
    return isinstance(w, torch.Tensor) and w.ndim == 2


def outside_shared(found: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """``found`` (``(module path, x)`` pairs) without the paths through a shared expert, or all of it
    where every path goes through one (the layer's only FFN is its shared MLP)."""
    kept = [(n, x) for n, x in found if not any(p in n for p in SHARED_PATHS)]
    return kept or found


def _one(module: torch.nn.Module, names: tuple[str, ...], skip: str | None = None) -> torch.nn.Module:
    found = outside_shared(
        [
            (n, m)
            for n, m in module.named_modules()
            if n and n.split(".")[-1] in names and is_matrix(m) and (skip is None or n.split(".")[0] != skip)
        ]
    )
    if len(found) != 1:
        raise LookupError(f"expected one of {names} in {type(module).__name__}, found {len(found)}")
    return found[0][1]


def _attn_name(layer: torch.nn.Module) -> str | None:
    return next((n for n in _ATTN if hasattr(layer, n)), None)  # None: NemotronH's layers call theirs "mixer"


def attn_out(hf: Any, layer: int) -> torch.nn.Module:
    """The attention output projection of ``layer``: its output is the attention's contribution. Where
    the output projection is no module (JetMoE: output experts applied inside the attention's forward),
    the attention module itself, whose first output is that contribution."""
    block = decoder_layers(hf)[layer]
    attn = getattr(block, _attn_name(block) or "self_attn")
    if not any(n.split(".")[-1] in _ATTN_OUT for n, _ in attn.named_modules()):
        return attn
    return _one(attn, _ATTN_OUT)


def attn_out_of(hf: Any, layer: int) -> torch.nn.Module | None:
    """:func:`attn_out` of ``layer``, or None where the layer has no softmax attention (a hybrid model's
    Mamba, linear-attention or convolution layer; NemotronH's layers hold their one sublayer as ``mixer``,
    attention where the layer's ``block_type`` says so)."""
    block = decoder_layers(hf)[layer]
    name = _attn_name(block)
    if name is not None and getattr(block, name) is not None:
        return attn_out(hf, layer)
    mixer = getattr(block, "mixer", None)
    if getattr(block, "block_type", None) == "full_attention" and isinstance(mixer, torch.nn.Module):
        return _one(mixer, _ATTN_OUT)
    return None


def branch_down(block: torch.nn.Module) -> torch.nn.Module | None:
    """A densified Gemma 4 MoE decoder layer's down projection (:mod:`._branch_ref`: both branches'
    neurons in, the FFN's output out), which is no submodule of it; None on other layers."""
    down = getattr(block, "_ref_down", None)
    return down if isinstance(down, torch.nn.Module) else None


def mlp_down(hf: Any, layer: int) -> torch.nn.Module:
    """The MLP's down projection of ``layer`` (its input is the neurons, its output the MLP's contribution)."""
    block = decoder_layers(hf)[layer]
    branches = branch_down(block)
    if branches is not None:
        return branches
    mlp = next((getattr(block, n) for n in _MLP if hasattr(block, n)), None)
    return _one(mlp, DOWN_NAMES) if mlp is not None else _one(block, DOWN_NAMES, skip=_attn_name(block))


def subject_positions(tok: Any, prompt: str, subject: str) -> tuple[int, int]:
    """Token positions ``[s0, s1)`` of ``subject`` in ``tok(prompt)``: tokens whose characters overlap it."""
    c0 = prompt.index(subject)
    c1 = c0 + len(subject)
    spans = tok(prompt, return_offsets_mapping=True)["offset_mapping"]
    hit = [i for i, (a, b) in enumerate(spans) if a < c1 and b > c0]
    return hit[0], hit[-1] + 1


@contextmanager
def hooked(pairs: list[tuple[torch.nn.Module, Callable[[torch.Tensor], torch.Tensor]]]) -> Iterator[None]:
    """Forward hooks that replace each module's output (its first element when a tuple) by ``fn(output)``."""

    def wrap(fn):
        def hook(mod, inp, out):
            if isinstance(out, tuple):
                return (fn(out[0]), *out[1:])
            return fn(out)

        return hook

    handles = [m.register_forward_hook(wrap(fn)) for m, fn in pairs]
    try:
        yield
    finally:
        for h in handles:
            h.remove()
