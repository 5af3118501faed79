"""Annotated square heatmap of a pairwise metric between named sets of located units."""

from __future__ import annotations

from collections.abc import Hashable, Mapping

import plotly.graph_objects as go

from capinterp.units.metrics import SET_METRICS, NamedSets, SetLike, intersection_size, pairwise

__all__ = ["overlap_matrix"]


def overlap_matrix(sets: NamedSets, metric: str = "overlap", title: str | None = None) -> go.Figure:
    """Annotated square heatmap of ``metrics.pairwise(sets, metric)``; hover adds the set sizes."""
    named: dict[Hashable, SetLike] = dict(sets) if isinstance(sets, Mapping) else dict(enumerate(sets))
    df = pairwise(named, metric)
    keys = list(named)
    names = [str(k) for k in keys]
    z = df.to_numpy(dtype=float)
    label = metric if isinstance(metric, str) else getattr(metric, "__name__", "metric")
    hover = [
        [
            f"{names[r]} vs {names[c]}: {label} {z[r, c]:.3f} "
            f"(|A∩B|={intersection_size(named[keys[r]], named[keys[c]])}, "
            f"|A|={len(named[keys[r]])}, |B|={len(named[keys[c]])})"
            for c in range(len(keys))
        ]
        for r in range(len(keys))
    ]
    bounded = isinstance(metric, str) and metric in SET_METRICS and metric != "intersection"
    fig = go.Figure(
        go.Heatmap(
            z=z,
            x=names,
            y=names,
            text=[[f"{v:.2f}" for v in row] for row in z],
            texttemplate="%{text}",
            customdata=hover,
            hovertemplate="%{customdata}<extra></extra>",
            colorscale="Blues",
            zmin=0.0 if bounded else None,
            zmax=1.0 if bounded else None,
            colorbar={"title": {"text": label}},
        )
    )
    fig.update_layout(
        title=title or f"pairwise {label}", xaxis_title="set", yaxis_title="set", yaxis={"autorange": "reversed"}
    )
    return fig
