"""Every plotly figure capinterp draws, and circuitsvis token views (:mod:`capinterp.plots.tokens`).

Figures read their inputs by attribute (``.scores``, ``.mask``, ``.meta``, a circuit's ``.graph``),
so this layer sits below :mod:`capinterp.units`, imports no result type, and result types draw
themselves through it (``NeuronScores.plot()``, ``Circuit.plot()``, ``ci.metrics.overlap_matrix``, ...)."""

from capinterp.plots.circuits import edge_heatmap, plot_circuit
from capinterp.plots.finetune import finetune_figure
from capinterp.plots.heatmaps import default_bin_size, layer_profile, neuron_heatmap
from capinterp.plots.matrix import pairwise_heatmap
from capinterp.plots.paper import measured_vs_paper
from capinterp.plots.tokens import attention_view, neuron_activations_view
from capinterp.plots.tracing import trace_heatmap

__all__ = [
    "attention_view",
    "default_bin_size",
    "edge_heatmap",
    "finetune_figure",
    "layer_profile",
    "measured_vs_paper",
    "neuron_activations_view",
    "neuron_heatmap",
    "pairwise_heatmap",
    "plot_circuit",
    "trace_heatmap",
]
