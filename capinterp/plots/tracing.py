"""Plotly heatmap of a causal-tracing grid, laid out like ROME's figures.

Rows are tokens (top to bottom in prompt order, subject tokens marked ``*``), columns are layers
(for ``mlp`` / ``attn`` a column is the centre of the restored window), colour is the indirect
effect. Returns a ``plotly.graph_objects.Figure`` and never calls ``show()``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go

__all__ = ["trace_heatmap"]

_COLORS = {"resid": "Purples", "mlp": "Greens", "attn": "Reds"}
_NAMES = {"resid": "hidden state", "mlp": "MLP", "attn": "attention"}
_AUTO_HEIGHT = 450  # plotly's default figure height


def trace_heatmap(
    grid,
    row_labels: Sequence[str],
    *,
    kind: str = "mlp",
    window: int = 10,
    subject_rows: Sequence[int] = (),
    answer: str | None = None,
    title: str | None = None,
) -> go.Figure:
    """Heatmap of ``grid`` [rows, layers] (a tensor or array of indirect effects).

    ``z`` of the returned figure is the grid itself (NaN where a group is absent); hover shows
    the token, the layer (and restored window), and the value.
    """
    z = np.asarray(grid.detach().cpu() if hasattr(grid, "detach") else grid, dtype=float)
    if z.ndim != 2 or z.shape[0] != len(row_labels):
        raise ValueError(f"grid of shape {z.shape} does not match {len(row_labels)} row labels")
    n_rows, n_layers = z.shape
    half, upper = window // 2, -(-window // 2)
    sub = set(subject_rows)
    text = []
    for r in range(n_rows):
        row = []
        for layer in range(n_layers):
            where = (
                f"layers {max(0, layer - half)}-{min(n_layers, layer + upper) - 1} (centre {layer})"
                if kind in ("mlp", "attn")
                else f"layer {layer}"
            )
            tag = " (subject)" if r in sub else ""
            val = "n/a" if np.isnan(z[r, layer]) else f"{z[r, layer]:.4f}"
            row.append(f"{row_labels[r]}{tag}, {where}: IE {val}")
        text.append(row)
    xtitle = (
        f"centre of interval of {window} restored {_NAMES.get(kind, kind)} layers"
        if kind in ("mlp", "attn")
        else "single restored layer"
    )
    cbar = "IE = p*restored - p*" + (f" of {answer!r}" if answer else "")
    fig = go.Figure(
        go.Heatmap(
            z=z,
            x=list(range(n_layers)),
            y=list(range(n_rows)),
            text=text,
            hovertemplate="%{text}<extra></extra>",
            colorscale=_COLORS.get(kind, "Viridis"),
            colorbar={"title": {"text": cbar}},
        )
    )
    fig.update_layout(
        title=title or f"Impact of restoring {_NAMES.get(kind, kind)} after corrupted input",
        xaxis_title=xtitle,
        yaxis={
            "tickmode": "array",
            "tickvals": list(range(n_rows)),
            "ticktext": list(row_labels),
            "autorange": "reversed",
        },
        # A page (write_html) or notebook cell sizes the grid while the rows fit (plotly's 450 px in a
        # notebook, the whole window on a page); only a long prompt asks for more, 28 px a row.
        height=28 * n_rows + 120 if 28 * n_rows + 120 > _AUTO_HEIGHT else None,
    )
    return fig
