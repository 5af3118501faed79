"""Decoder-layer steps beside attention and the FFN that write to or rescale the residual stream.

DeepSeek-V4 keeps several residual streams between layers (hyper-connections, ``Family.residual_streams``):
each sublayer reads a learned, input-dependent mix of them and writes into all of them.

Gemma 4's text model (E2B / E4B) ends each layer with two more steps: per-layer embeddings (PLE:
``per_layer_input_gate`` reads the residual after the MLP, is multiplied by the token's per-layer
embedding, and ``per_layer_projection`` writes the product back, after its own norm), then
``hidden *= layer_scalar``. Every neuron method reads the model through its hooks and its own forward,
so these steps count there as transformers computes them. A method that splits the residual stream
into its sublayers' outputs (the circuit graph: knowledge circuits, head patching, AtP) cannot: PLE
is a third writer the graph has no node for, and a layer scale rescales every earlier contribution,
so an edge would not carry its source's output. :func:`require_additive_layers` refuses those methods,
naming the steps, before any work.
"""

from __future__ import annotations

import torch

from capinterp.core.family import UnsupportedFamily, family_of
from capinterp.core.gated_mlp import unwrap
from capinterp.core.protocol import Model

__all__ = ["layer_extras", "layer_scalars", "require_additive_layers"]


def layer_scalars(model: Model) -> list[float]:
    """Each layer's scale of the whole residual stream at its end (Gemma 4's ``layer_scalar``, a
    one-element buffer); 1 where a layer has none."""
    out = []
    for b in model.blocks:
        s = getattr(unwrap(b), "layer_scalar", None)
        out.append(float(s.float().prod()) if isinstance(s, torch.Tensor) else 1.0)
    return out


def layer_extras(model: Model) -> list[str]:
    """The steps, in words, by which the model's layers write to or scale the residual stream beside
    their attention (or mixer) and FFN; empty where there are none."""
    layers = [unwrap(b) for b in model.blocks]
    ple = [l for l, layer in enumerate(layers) if getattr(layer, "per_layer_input_gate", None) is not None]
    scaled = [l for l, s in enumerate(layer_scalars(model)) if s != 1.0]
    found = []
    streams = family_of(model).residual_streams
    if streams > 1:
        found.append(
            f"keeps {streams} residual streams between layers (hyper-connections: each sublayer reads a learned, "
            "input-dependent mix of them and writes into all of them, so no output joins the residual additively)"
        )
    if ple:
        found.append(
            f"adds per-layer embeddings after the MLP in layers {ple} (PLE: per_layer_input_gate / "
            "per_layer_projection, a third writer to the residual stream, with no node in the graph)"
        )
    if scaled:
        found.append(
            f"scales the residual stream at the end of layers {scaled} (layer_scalar != 1: every earlier "
            "contribution is rescaled there, so an edge would not carry its source's output)"
        )
    return found


def require_additive_layers(model: Model, what: str) -> None:
    """Refuse ``what`` (a method on the circuit graph) where a layer writes to or scales the residual
    stream beside its attention and FFN (:func:`layer_extras`)."""
    if found := layer_extras(model):
        fam = family_of(model)
        raise UnsupportedFamily(
            f"{fam.name} ({fam.architecture}): {what} splits the residual stream into attention, mixer and MLP "
            f"outputs, and this model {'; and '.join(found)}; its neuron methods run, this one cannot"
        )
