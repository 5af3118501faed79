"""Neuron-level results over ``blocks.{l}.mlp.hook_post`` ([n_layers, d_mlp]) in one import:

- :class:`~capinterp.units.neuron_scores.NeuronScores`: float32 scores and the selection rules
  (``select`` / ``top_k`` / ``threshold``);
- :class:`~capinterp.units.neuron_set.NeuronSet`: a bool mask, the :class:`~capinterp.units.base.UnitSet`
  of kind ``"neuron"`` whose keys are ``(layer, index)`` tuples;
- :func:`load`: whichever of the two a ``.capi`` file or folder holds (format:
  :mod:`capinterp.units.neuron_io`).

Metadata keys (all optional, JSON-serializable): method, params (hyper-parameters), model,
model_fingerprint, n_params (all model parameters), params_per_neuron, dataset, n_samples, version
(auto-filled). Sets made by a rule add ``selection``; random controls add ``random_control``.
"""

from __future__ import annotations

import os
from typing import Any

from capinterp.units.neuron_io import FORMAT_VERSION
from capinterp.units.neuron_scores import NeuronScores
from capinterp.units.neuron_set import NeuronSet
from capinterp.units.neuron_tensor import load as _load

__all__ = ["FORMAT_VERSION", "NeuronScores", "NeuronSet", "load"]


def load(
    path: str | os.PathLike,
    expected_shape: Any = None,
    *,
    model_shape: Any = None,
    fingerprint: str | None = None,
    model: Any = None,
    across_models: bool = False,
) -> NeuronScores | NeuronSet:
    """Load whichever of NeuronScores / NeuronSet is stored at ``path`` (file or folder); ValueError
    for a damaged file or one made for another model shape / fingerprint (``model=m`` checks against
    that model; ``across_models=True`` accepts another checkpoint of its architecture)."""
    obj = _load(
        path, expected_shape, model_shape=model_shape, fingerprint=fingerprint, model=model, across_models=across_models
    )
    assert isinstance(obj, (NeuronScores, NeuronSet))
    return obj
