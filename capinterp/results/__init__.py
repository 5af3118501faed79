"""Neuron-level results: :class:`NeuronScores` (float ``[n_layers, d_mlp]``) and :class:`NeuronSet` (bool mask)."""

from capinterp.results.neurons import NeuronScores, NeuronSet

__all__ = ["NeuronScores", "NeuronSet"]
