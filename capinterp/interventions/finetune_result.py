"""The result of :func:`capinterp.interventions.finetune`: per-arm table, evaluations, loss history, figure."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pandas as pd

from capinterp.plots.finetune import finetune_figure
from capinterp.units.neurons import NeuronSet

__all__ = ["FinetuneResult"]

if TYPE_CHECKING:
    import plotly.graph_objects as go


@dataclass
class FinetuneResult:
    """Per-arm outcome of :func:`capinterp.interventions.finetune.finetune`.

    Attributes:
        table: one row per arm: ``arm, lr, n_neurons, n_trainable_params, param_share,
            train_loss_before, train_loss_after``, ``{set}_acc_before`` / ``{set}_acc_after``
            for every evaluation set, ``train_s`` and ``s_per_epoch``.
        evals: long form of the evaluations: ``arm, dataset, stage, accuracy, mean_prob, n``.
        history: the training loss of every step: ``arm, epoch, step, loss``.
        neurons: the neuron set each neuron-level arm trained (``"located"``, ``"random"``).
        models: the trained models (``keep_models=True``, or the caller's with ``inplace=True``).
        config: lr per arm, epochs, batch size, seed, device, number of training examples.
    """

    table: pd.DataFrame
    evals: pd.DataFrame
    history: pd.DataFrame
    neurons: dict[str, NeuronSet] = field(default_factory=dict)
    models: dict[str, Any] = field(default_factory=dict, repr=False)
    config: dict[str, Any] = field(default_factory=dict)

    def plot(self) -> go.Figure:
        """Plotly bars, before vs after per arm: the training loss, then each set's accuracy."""
        return finetune_figure(self.table)

    @property
    def figure(self) -> go.Figure:
        """Same as :meth:`plot`."""
        return self.plot()
