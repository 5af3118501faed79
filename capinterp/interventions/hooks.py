"""Erase / amplify / scale located neurons, as context managers over forward hooks.

    with ci.erase(model, neurons):        # hook_post[..., i] = 0 for every located (l, i)
        ci.evaluate(model, ds)
    with ci.scale(model, neurons, 2.0):   # amplify (or suppress with a factor < 1)
        ...

Zeroing ``hook_post`` at all positions equals zeroing the neuron's ``W_out`` row (bias aside).
The NeuronSet is checked against the model (shape, and fingerprint when both are known)
before any hook is attached. Hooks are removed on exit, also after an exception.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from capinterp.arch.family import family_of
from capinterp.arch.model import neuron_hook, valid_neurons
from capinterp.core import validate
from capinterp.core.protocol import Model
from capinterp.units.base import KeySet
from capinterp.units.neurons import NeuronSet

__all__ = ["amplify", "check_neurons", "check_no_padding", "erase", "neuron_hooks", "scale"]


def check_neurons(model: Model, neurons: NeuronSet, across_models: bool = False) -> None:
    """Raise a clear ValueError if ``neurons`` was made for another model (other weights or config).

    ``across_models=True`` accepts a set located on another checkpoint of the same architecture
    (e.g. erasing base-model neurons in its fine-tune): only the architecture must then match.
    """
    validate.model(model)
    if not isinstance(neurons, NeuronSet):
        raise TypeError(f"neurons must be a NeuronSet, got {type(neurons).__name__}")
    neurons.check_model(model, across_models=across_models)
    check_no_padding(model, neurons)


def check_no_padding(model: Model, neurons: NeuronSet) -> None:
    """ValueError if ``neurons`` holds padding neurons of ``model``: positions past a narrower layer's
    own width on a model whose layers differ in width (a set built from a bare mask, without the
    model's ``layer_widths``, can hold them; they are always 0 and no neurons of the model)."""
    valid = valid_neurons(model)
    if tuple(valid.shape) != neurons.shape or bool(valid.all()):
        return
    if outside := int((neurons.mask & ~valid).sum()):
        raise ValueError(
            f"neurons holds {outside} padding neurons of this model: positions past a dense layer's own width "
            f"(layer widths {list(family_of(model).layer_widths)}) are not neurons of the model; build a hand-made "
            "set as NeuronSet(mask, meta=capinterp.model_meta(model)), whose random_like then draws real neurons only"
        )


def neuron_hooks(
    model: Model, neurons: NeuronSet | KeySet, factor: float, across_models: bool = False
) -> list[tuple[str, object]]:
    """Forward hooks multiplying the located neurons' activations by ``factor`` at every position.

    ``neurons`` may also be a KeySet of ``(layer, expert)`` keys (:mod:`capinterp.units.experts`):
    every neuron of those experts (erasing an expert zeroes its output, routing unchanged).
    """
    if isinstance(neurons, KeySet):
        if neurons.kind != "expert":
            raise TypeError(f"neurons must be a NeuronSet or a KeySet of experts, got a KeySet of {neurons.kind!r}")
        from capinterp.units.experts import expert_neurons

        neurons = expert_neurons(model, neurons)
    check_neurons(model, neurons, across_models)
    hooks: list[tuple[str, object]] = []
    dev = model.cfg.device
    for layer in range(neurons.n_layers):
        idx = neurons.mask[layer].nonzero().flatten()
        if idx.numel() == 0:
            continue
        idx = idx.to(dev)

        def hook(act: torch.Tensor, hook, idx=idx) -> torch.Tensor:
            act = act.clone()
            act[..., idx] = act[..., idx] * factor
            return act

        hooks.append((neuron_hook(layer), hook))
    return hooks


@contextmanager
def scale(model: Model, neurons: NeuronSet | KeySet, factor: float, *, across_models: bool = False) -> Iterator[object]:
    """Multiply the located neurons' activations by ``factor`` inside the ``with`` block."""
    factor = validate.finite_float("factor", factor)
    with model.hooks(fwd_hooks=neuron_hooks(model, neurons, factor, across_models)):
        yield model


def erase(model: Model, neurons: NeuronSet | KeySet, *, across_models: bool = False):
    """Zero the located neurons' activations (all positions) inside the ``with`` block."""
    return scale(model, neurons, 0.0, across_models=across_models)


def amplify(model: Model, neurons: NeuronSet | KeySet, factor: float = 2.0, *, across_models: bool = False):
    """Multiply the located neurons' activations by ``factor`` (default 2, as in KN and CNL)."""
    return scale(model, neurons, factor, across_models=across_models)
