"""Annotated square heatmap of a pairwise matrix between named items (e.g. a metric between sets of
located units: :func:`capinterp.units.metrics.overlap_matrix` computes it and draws through here)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go

__all__ = ["pairwise_heatmap"]


def pairwise_heatmap(
    z: np.ndarray,
    names: Sequence[str],
    hover: Sequence[Sequence[str]],
    label: str,
    *,
    unit_range: bool = False,
    title: str | None = None,
) -> go.Figure:
    """Annotated square heatmap of ``z[r, c]`` (two decimals in each cell), one ``hover`` line per cell;
    ``unit_range`` pins the colour scale to [0, 1] (bounded metrics)."""
    fig = go.Figure(
        go.Heatmap(
            z=z,
            x=list(names),
            y=list(names),
            text=[[f"{v:.2f}" for v in row] for row in z],
            texttemplate="%{text}",
            customdata=[list(row) for row in hover],
            hovertemplate="%{customdata}<extra></extra>",
            colorscale="Blues",
            zmin=0.0 if unit_range else None,
            zmax=1.0 if unit_range else None,
            colorbar={"title": {"text": label}},
        )
    )
    fig.update_layout(
        title=title or f"pairwise {label}", xaxis_title="set", yaxis_title="set", yaxis={"autorange": "reversed"}
    )
    return fig
