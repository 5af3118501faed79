"""Grouped bars of a measured quantity beside the paper's value for the same rows."""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go

__all__ = ["measured_vs_paper"]


def measured_vs_paper(
    x: Sequence,
    measured: Sequence[float],
    paper: Sequence[float],
    *,
    title: str,
    yaxis_title: str,
    xaxis_title: str | None = None,
    measured_name: str = "measured",
    paper_name: str = "paper (GPT-J)",
) -> go.Figure:
    """Two bars per row of ``x``: ours (``measured``) and the paper's (``paper``; NaN where it gives none)."""
    fig = go.Figure(
        [go.Bar(name=measured_name, x=list(x), y=list(measured)), go.Bar(name=paper_name, x=list(x), y=list(paper))]
    )
    fig.update_layout(barmode="group", title=title, yaxis_title=yaxis_title, xaxis_title=xaxis_title)
    return fig
