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

from contextlib import contextmanager
from typing import Iterator

import torch

from capinterp.core.model import model_fingerprint, neuron_hook, neuron_shape
from capinterp.results.neurons import NeuronSet


def check_neurons(model, neurons: NeuronSet) -> None:
    """Raise a clear ValueError if ``neurons`` was made for another model."""
    if not isinstance(neurons, NeuronSet):
        raise TypeError(f"expected a NeuronSet, got {type(neurons).__name__}")
    neurons.check_compatible(neuron_shape(model), model_fingerprint(model))


def neuron_hooks(model, neurons: NeuronSet, factor: float) -> list[tuple[str, object]]:
    """Forward hooks multiplying the located neurons' activations by ``factor`` at every position."""
    check_neurons(model, neurons)
    hooks = []
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
def scale(model, neurons: NeuronSet, factor: float) -> Iterator[object]:
    """Multiply the located neurons' activations by ``factor`` inside the ``with`` block."""
    with model.hooks(fwd_hooks=neuron_hooks(model, neurons, float(factor))):
        yield model


def erase(model, neurons: NeuronSet):
    """Zero the located neurons' activations (all positions) inside the ``with`` block."""
    return scale(model, neurons, 0.0)


def amplify(model, neurons: NeuronSet, factor: float = 2.0):
    """Multiply the located neurons' activations by ``factor`` (default 2, as in KN and CNL)."""
    return scale(model, neurons, factor)
