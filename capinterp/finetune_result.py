"""The result of :func:`capinterp.finetune`: per-arm table, evaluations, loss history, figure."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pandas as pd

from capinterp.neurons import NeuronSet

if TYPE_CHECKING:
    import plotly.graph_objects as go


@dataclass
class FinetuneResult:
    """Per-arm outcome of :func:`capinterp.finetune.finetune`.

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

    def plot(self) -> "go.Figure":
        """Plotly bars, before vs after per arm: the training loss, then each set's accuracy."""
        return finetune_figure(self.table)

    @property
    def figure(self) -> "go.Figure":
        """Same as :meth:`plot`."""
        return self.plot()


def finetune_figure(table: pd.DataFrame, title: str = "Neuron-level fine-tuning: before vs after") -> "go.Figure":
    """Grouped before/after bars per arm, one panel per metric of a :class:`FinetuneResult` table."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    metrics = ["train_loss"] + [c[: -len("_before")] for c in table.columns
                                if c.endswith("_acc_before")]
    fig = make_subplots(rows=1, cols=len(metrics), subplot_titles=[m.replace("_", " ") for m in metrics])
    for col, metric in enumerate(metrics, start=1):
        for stage, color in (("before", "#9aa5b1"), ("after", "#2b6cb0")):
            fig.add_trace(go.Bar(x=table["arm"], y=table[f"{metric}_{stage}"], name=stage, marker_color=color,
                                 legendgroup=stage, showlegend=col == 1,
                                 hovertemplate=f"%{{x}}<br>{metric} {stage}: %{{y:.4g}}<extra></extra>"),
                          row=1, col=col)
    fig.update_layout(barmode="group", title=title, height=380, width=max(480, 340 * len(metrics)))
    return fig
