"""Plotly figures of circuits: the layered graph and the edge-score heatmap (never ``show()``).

:func:`plot_circuit`: nodes on a layered layout (x: ``input``, then per layer its heads and its
MLP, a hybrid layer's mixer node ``x{l}`` in its heads' column, then ``logits``; y: head index), edges as lines from the source node to the reader of the
slot (q enters a little above the head, k level, v a little below; a KV-group slot enters at the
middle of its group), width proportional to |score| (5 width classes) and colour by sign (blue:
positive, the edge supports the clean answer; red: negative; grey: no score). Hovering an edge's
midpoint shows its name and score.

:func:`edge_heatmap`: sources (y) x slots (x), the score of every edge (blank off the edges),
diverging colours centred at 0; kept edges marked with dots.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import plotly.graph_objects as go

if TYPE_CHECKING:  # annotations only: figures read a circuit by attribute
    from capinterp.circuits.graph import Circuit, Graph

__all__ = ["edge_heatmap", "layout", "plot_circuit"]

_POS, _NEG, _NONE = "#2166ac", "#b2182b", "#9e9e9e"
_NODE_COLORS = {
    "input": "#4d4d4d",
    "attn": "#f4a582",
    "mixer": "#c2a5cf",
    "mlp": "#92c5de",
    "ple": "#a6dba0",
    "logits": "#4d4d4d",
}
_SLOT_DY = {"q": 0.22, "k": 0.0, "v": -0.22}


def layout(graph: Graph) -> dict[str, tuple[float, float]]:
    """Node name -> (x, y)."""
    H = graph.n_heads
    pos = {graph.input_node: (0.0, 0.0), graph.logits_node: (2.0 * graph.n_layers + 1, 0.0)}
    for l in range(graph.n_layers):
        heads = graph.has_heads(l)
        if heads:
            for h in range(H):
                pos[f"a{l}.h{h}"] = (2.0 * l + 1, h - (H - 1) / 2)
        if graph.has_mixer(l):  # a hybrid layer's mixer: in the heads' column, below them beside heads
            pos[f"x{l}"] = (2.0 * l + 1, -(H + 1) / 2 if heads else 0.0)
        pos[f"m{l}"] = (2.0 * l + 2, 0.0)
        if graph.ple:  # Gemma 4's per-layer embedding: after the MLP, below it
            pos[f"p{l}"] = (2.0 * l + 2, -(H + 1) / 2)
    return pos


def _slot_point(graph: Graph, j: int, pos: dict) -> tuple[float, float]:
    nodes = graph.slot_nodes(j)
    x = pos[nodes[0]][0]
    y = float(np.mean([pos[n][1] for n in nodes]))
    kind = graph.slots[j].partition("<")[2]
    return x - 0.12 * bool(kind), y + _SLOT_DY.get(kind, 0.0)


def plot_circuit(
    circuit: Circuit,
    *,
    show_all_nodes: bool = False,
    max_edges: int | None = 2000,
    title: str | None = None,
    width_max: float = 6.0,
) -> go.Figure:
    """The circuit on a layered layout (see the module docstring). ``max_edges``: draw the largest only."""
    g = circuit.graph
    pos = layout(g)
    sj = {s: j for j, s in enumerate(g.slots)}
    edges = list(circuit.edges.items())
    if max_edges is not None and len(edges) > max_edges:
        edges = sorted(edges, key=lambda kv: -abs(kv[1] or 0.0))[:max_edges]
    top = max((abs(s) for _, s in edges if s is not None), default=0.0) or 1.0
    fig = go.Figure()
    groups: dict[tuple[str, int], tuple[list, list]] = {}
    mid_x, mid_y, mid_text = [], [], []
    for (src, dst), s in edges:
        x0, y0 = pos[src]
        x1, y1 = _slot_point(g, sj[dst], pos)
        colour = _NONE if s is None else (_POS if s >= 0 else _NEG)
        cls = 2 if s is None else min(4, int(5 * abs(s) / top))
        xs, ys = groups.setdefault((colour, cls), ([], []))
        xs += [x0, x1, None]
        ys += [y0, y1, None]
        mid_x.append((x0 + x1) / 2)
        mid_y.append((y0 + y1) / 2)
        mid_text.append(f"{src} → {dst}" + ("" if s is None else f"<br>score {s:.4g}"))
    for (colour, cls), (xs, ys) in sorted(groups.items(), key=lambda kv: kv[0][1]):
        fig.add_trace(
            go.Scatter(
                x=xs,
                y=ys,
                mode="lines",
                hoverinfo="skip",
                showlegend=False,
                line=dict(color=colour, width=0.5 + width_max * (cls + 1) / 5),
                opacity=0.7,
            )
        )
    fig.add_trace(
        go.Scatter(
            x=mid_x,
            y=mid_y,
            mode="markers",
            marker=dict(size=6, opacity=0),
            hovertext=mid_text,
            hoverinfo="text",
            showlegend=False,
        )
    )
    names = list(g.nodes) if show_all_nodes else circuit.nodes
    kind_of = {"a": "attn", "x": "mixer", "m": "mlp", "p": "ple"}
    kinds = [n if n in (g.input_node, g.logits_node) else kind_of[n[0]] for n in names]
    for kind in ("input", "attn", "mixer", "mlp", "ple", "logits"):
        sel = [n for n, k in zip(names, kinds) if k == kind]
        if not sel:
            continue
        fig.add_trace(
            go.Scatter(
                x=[pos[n][0] for n in sel],
                y=[pos[n][1] for n in sel],
                mode="markers+text",
                name=kind,
                text=sel,
                textposition="top center",
                textfont=dict(size=9),
                hoverinfo="text",
                marker=dict(size=14, color=_NODE_COLORS[kind], line=dict(width=1, color="#333")),
            )
        )
    ticks = [0] + [2 * l + 1.5 for l in range(g.n_layers)] + [2 * g.n_layers + 1]
    fig.update_layout(
        title=title or f"Circuit: {len(circuit)} edges, {len(circuit.nodes)} nodes",
        xaxis=dict(
            tickvals=ticks,
            ticktext=["input"] + [f"L{l}" for l in range(g.n_layers)] + ["logits"],
            showgrid=False,
            zeroline=False,
        ),
        yaxis=dict(title="head", showgrid=False, zeroline=False),
        plot_bgcolor="white",
        hovermode="closest",
    )
    return fig


def edge_heatmap(circuit: Circuit, *, abs: bool = False, mark_kept: bool = True, title: str | None = None) -> go.Figure:
    """Sources x slots heatmap of every edge's score (|score| with ``abs=True``)."""
    g = circuit.graph
    if circuit.scores is None:
        z = circuit.mask.float().numpy()
        label = "kept"
    else:
        z = circuit.scores.numpy().astype(float)
        z = np.abs(z) if abs else z
        label = "|score|" if abs else "score"
    z = np.where(g.edge_mask.numpy(), z, np.nan)
    lim = float(np.nanmax(np.abs(z))) if np.isfinite(z).any() else 1.0
    heat = go.Heatmap(
        z=z,
        x=list(g.slots),
        y=list(g.sources),
        colorbar=dict(title=label),
        colorscale="Blues" if (abs or circuit.scores is None) else "RdBu",
        reversescale=not abs and circuit.scores is not None,
        zmid=None if abs else 0.0,
        zmin=None if not abs else 0.0,
        zmax=lim or 1.0,
        hovertemplate="%{y} → %{x}<br>" + label + " %{z:.4g}<extra></extra>",
    )
    fig = go.Figure(heat)
    if mark_kept and len(circuit):
        keys = circuit.graph.edges(circuit.mask)
        fig.add_trace(
            go.Scatter(
                x=[b for _, b in keys],
                y=[a for a, _ in keys],
                mode="markers",
                name="kept",
                marker=dict(size=4, color="black"),
                hoverinfo="skip",
            )
        )
    fig.update_layout(
        title=title or f"Edge scores ({g.n_edges} edges, {len(circuit)} kept)",
        xaxis=dict(title="reading slot", tickangle=-90, tickfont=dict(size=7)),
        yaxis=dict(title="writing node", autorange="reversed", tickfont=dict(size=7)),
        plot_bgcolor="white",
    )
    return fig
