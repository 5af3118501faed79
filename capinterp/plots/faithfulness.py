"""Faithfulness curves (see :mod:`capinterp.interventions.faithfulness`): f of the kept top-k
against the share of units kept, the random band shaded, the top-k-ablated curve dashed."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

__all__ = ["faithfulness_curve"]


def faithfulness_curve(table: pd.DataFrame, title: str | None = None) -> go.Figure:
    """Plotly figure from a ``Faithfulness.table`` (columns ``fraction``, ``faithfulness``, ...)."""
    x = table["fraction"]
    fig = go.Figure()
    if "random_faithfulness_p05" in table:
        fig.add_trace(
            go.Scatter(x=x, y=table["random_faithfulness_p95"], mode="lines", line={"width": 0}, showlegend=False)
        )
        fig.add_trace(
            go.Scatter(
                x=x,
                y=table["random_faithfulness_p05"],
                mode="lines",
                fill="tonexty",
                line={"width": 0},
                fillcolor="rgba(128,128,128,0.3)",
                name="random sets, 5-95 %",
            )
        )
        fig.add_trace(go.Scatter(x=x, y=table["random_faithfulness_mean"], line={"color": "gray"}, name="random mean"))
    fig.add_trace(go.Scatter(x=x, y=table["faithfulness"], mode="lines+markers", name="top-k kept"))
    fig.add_trace(go.Scatter(x=x, y=table["ablated_faithfulness"], line={"dash": "dash"}, name="top-k ablated"))
    fig.add_hline(y=1.0, line={"dash": "dot", "color": "black"})
    fig.update_layout(
        title=title,
        xaxis={"title": "share of units kept", "type": "log"},
        yaxis={"title": "faithfulness (0 = all ablated, 1 = full model)"},
        template="plotly_white",
    )
    return fig
