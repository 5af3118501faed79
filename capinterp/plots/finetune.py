"""Before/after bars of neuron-level fine-tuning, one panel per metric (the DCSN paper, anon. 2025, Table 6's view)."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

__all__ = ["finetune_figure"]


def finetune_figure(table: pd.DataFrame, title: str = "Neuron-level fine-tuning: before vs after") -> go.Figure:
    """Grouped before/after bars per arm, one panel per metric of a :class:`FinetuneResult` table."""
    metrics = ["train_loss"] + [c[: -len("_before")] for c in table.columns if c.endswith("_acc_before")]
    fig = make_subplots(rows=1, cols=len(metrics), subplot_titles=[m.replace("_", " ") for m in metrics])
    for col, metric in enumerate(metrics, start=1):
        for stage, color in (("before", "#9aa5b1"), ("after", "#2b6cb0")):
            fig.add_trace(
                go.Bar(
                    x=table["arm"],
                    y=table[f"{metric}_{stage}"],
                    name=stage,
                    marker_color=color,
                    legendgroup=stage,
                    showlegend=col == 1,
                    hovertemplate=f"%{{x}}<br>{metric} {stage}: %{{y:.4g}}<extra></extra>",
                ),
                row=1,
                col=col,
            )
    # sized by its page or notebook cell (a fixed size left most of a written page blank)
    fig.update_layout(barmode="group", title=title)
    return fig
