"""Decoder-layer steps beside attention and the FFN that write to or rescale the residual stream.

DeepSeek-V4 keeps several residual streams between layers (hyper-connections, ``Family.residual_streams``):
each sublayer reads a learned, input-dependent mix of them and writes into all of them. Gemma 3n keeps
several too (AltUp, ``Family.altup_streams``): each layer predicts every stream from all of them, runs on
one, and corrects all of them.

Gemma 4's text model (E2B / E4B) ends each layer with two more steps: per-layer embeddings (PLE:
``per_layer_input_gate`` reads the residual after the MLP, is multiplied by the token's per-layer
embedding, and ``per_layer_projection`` writes the product back, after its own norm), then
``hidden *= layer_scalar``. Every neuron method reads the model through its hooks and its own forward,
so these steps count there as transformers computes them. The circuit graph (knowledge circuits, head
patching, AtP) takes each per-layer embedding as a node ``p{l}`` and carries the layer scales between a
node and its readers (:mod:`capinterp.circuits.forward`); RelP refuses PLE (no propagation rule of its
covers the gate's product). No graph splits several residual streams: :func:`require_additive_layers`
refuses what a method does not serve, naming the steps, before any work.
"""

from __future__ import annotations

import torch

from capinterp.arch.family import UnsupportedFamily, family_of
from capinterp.arch.gated_mlp import unwrap
from capinterp.core.protocol import Model

__all__ = ["layer_extras", "layer_scalars", "ple_layers", "require_additive_layers", "stream_scales"]


def layer_scalars(model: Model) -> list[float]:
    """Each layer's scale of the whole residual stream at its end (Gemma 4's ``layer_scalar``, a
    one-element buffer); 1 where a layer has none."""
    out = []
    for b in model.blocks:
        s = getattr(unwrap(b), "layer_scalar", None)
        out.append(float(s.float().prod()) if isinstance(s, torch.Tensor) else 1.0)
    return out


def stream_scales(model: Model) -> list[float]:
    """``[n_layers + 1]``: the product of the layer scales before each layer (and, last, before the final
    norm): a node of layer ``l`` adds its output into a stream that every later layer ``k >= l`` then
    scales by ``layer_scalar[k]`` (Gemma 4), so a reader at layer ``l2`` sees it times ``P[l2] / P[l]``.
    All ones on every other family."""
    out = [1.0]
    for s in layer_scalars(model):
        out.append(out[-1] * s)
    return out


def ple_layers(model: Model) -> list[int]:
    """The layers that add a per-layer embedding after their MLP (Gemma 4's PLE)."""
    return [l for l, b in enumerate(model.blocks) if getattr(unwrap(b), "per_layer_input_gate", None) is not None]


def layer_extras(model: Model) -> dict[str, str]:
    """The steps by which the model's layers write to or scale the residual stream beside their attention
    (or mixer) and FFN, by kind (``"streams"``, ``"altup"``, ``"ple"``, ``"scaled"``), in words; empty where
    there are none."""
    ple = ple_layers(model)
    scaled = [l for l, s in enumerate(layer_scalars(model)) if s != 1.0]
    found = {}
    streams = family_of(model).residual_streams
    if streams > 1:
        found["streams"] = (
            f"keeps {streams} residual streams between layers (hyper-connections: each sublayer reads a learned, "
            "input-dependent mix of them and writes into all of them, so no output joins the residual additively)"
        )
    altup = family_of(model).altup_streams
    if altup > 1:
        found["altup"] = (
            f"keeps {altup} residual streams between layers (AltUp: each layer predicts every stream from all of "
            "them, runs attention and the MLP on one, and corrects all of them with learned, input-dependent "
            "coefficients, so no output joins the residual additively)"
        )
    if ple:
        found["ple"] = (
            f"adds per-layer embeddings after the MLP in layers {ple} (PLE: per_layer_input_gate / "
            "per_layer_projection, a third writer to the residual stream)"
        )
    if scaled:
        found["scaled"] = (
            f"scales the residual stream at the end of layers {scaled} (layer_scalar != 1: every earlier "
            "contribution is rescaled there)"
        )
    return found


def require_additive_layers(model: Model, what: str, served: tuple[str, ...] = ()) -> None:
    """Refuse ``what`` (a method on the circuit graph) where a layer writes to or scales the residual
    stream beside its attention and FFN (:func:`layer_extras`) in a way the method does not serve
    (``served``: the kinds it does)."""
    if found := [text for kind, text in layer_extras(model).items() if kind not in served]:
        fam = family_of(model)
        raise UnsupportedFamily(
            f"{fam.name} ({fam.architecture}): {what} splits the residual stream into attention, mixer and MLP "
            f"outputs, and this model {'; and '.join(found)}; its neuron methods run, this one cannot"
        )
