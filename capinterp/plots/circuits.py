"""Plotly figures of circuits: the layered graph and the edge-score heatmap (never ``show()``).

:func:`plot_circuit`: nodes on a layered layout (x: ``input``, then per layer its heads and its
MLP, a hybrid layer's mixer node ``x{l}`` in its heads' column, then ``logits``; y: head index), edges as lines from the source node to the reader of the
slot (q enters a little above the head, k level, v a little below; a KV-group slot enters at the
middle of its group), width proportional to |score| (5 width classes) and colour by sign (blue:
positive, the edge supports the clean answer; red: negative; grey: no score). Hovering an edge's
midpoint shows its name and score. A legend names the edge colours and the node kinds; heads are
placed by layer (x) and head (y) and named in their hover, MLP nodes are labelled (every k-th
layer when the layers are too many for the labels to fit).

:func:`edge_heatmap`: sources (y) x slots (x), the score of every edge (blank off the edges),
diverging colours centred at 0 on a signed-log scale (``scale="linear"``: a robust range); kept
edges circled; axes labelled once per layer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np
import plotly.graph_objects as go
import torch

__all__ = ["edge_heatmap", "layout", "plot_circuit"]


class _GraphLike(Protocol):
    """What the figures read of a :class:`capinterp.circuits.Graph`: the plots layer sits below the
    circuits layer and imports none of its types, so a graph is read by attribute only."""

    @property
    def n_layers(self) -> int: ...
    @property
    def n_heads(self) -> int: ...
    @property
    def ple(self) -> bool: ...
    @property
    def input_node(self) -> str: ...
    @property
    def logits_node(self) -> str: ...
    @property
    def sources(self) -> Sequence[str]: ...
    @property
    def slots(self) -> Sequence[str]: ...
    @property
    def nodes(self) -> Sequence[str]: ...
    @property
    def edge_mask(self) -> torch.Tensor: ...
    @property
    def n_edges(self) -> int: ...
    def has_heads(self, l: int) -> bool: ...
    def has_mixer(self, l: int) -> bool: ...
    def slot_nodes(self, j: int) -> tuple[str, ...]: ...


class _CircuitLike(Protocol):
    """What the figures read of a :class:`capinterp.circuits.Circuit` (by attribute, as :class:`_GraphLike`)."""

    @property
    def graph(self) -> _GraphLike: ...
    @property
    def mask(self) -> torch.Tensor: ...
    @property
    def scores(self) -> torch.Tensor | None: ...
    @property
    def edges(self) -> dict[tuple[str, str], float | None]: ...
    @property
    def nodes(self) -> list[str]: ...
    def __len__(self) -> int: ...


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


def layout(graph: _GraphLike) -> dict[str, tuple[float, float]]:
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


def _slot_point(graph: _GraphLike, j: int, pos: dict) -> tuple[float, float]:
    nodes = graph.slot_nodes(j)
    x = pos[nodes[0]][0]
    y = float(np.mean([pos[n][1] for n in nodes]))
    kind = graph.slots[j].partition("<")[2]
    return x - 0.12 * bool(kind), y + _SLOT_DY.get(kind, 0.0)


def plot_circuit(
    circuit: _CircuitLike,
    *,
    show_all_nodes: bool = False,
    max_edges: int | None = 2000,
    title: str | None = None,
    width_max: float = 6.0,
) -> go.Figure:
    """The circuit on a layered layout (see the module docstring). ``max_edges``: draw the largest only."""
    g = circuit.graph
    pos = layout(g)
    edges = list(circuit.edges.items())
    if max_edges is not None and len(edges) > max_edges:
        edges = sorted(edges, key=lambda kv: -abs(kv[1] or 0.0))[:max_edges]
    fig = go.Figure()
    _edge_traces(fig, g, pos, edges, width_max)
    _node_traces(fig, g, pos, list(g.nodes) if show_all_nodes else circuit.nodes)
    every = _label_stride(g.n_layers)
    ticks = [0] + [2 * l + 1.5 for l in range(g.n_layers)] + [2 * g.n_layers + 1]
    H = g.n_heads
    heads = [h - (H - 1) / 2 for h in range(H)]
    fig.update_layout(
        title=title or f"Circuit: {len(circuit)} edges, {len(circuit.nodes)} nodes",
        xaxis=dict(
            tickvals=[0, *ticks[1:-1][::every], ticks[-1]],
            ticktext=["input"] + [f"L{l}" for l in range(0, g.n_layers, every)] + ["logits"],
            showgrid=False,
            zeroline=False,
            title="layer (attention heads, then the MLP)",
        ),
        yaxis=dict(
            title="head",
            tickvals=heads,
            ticktext=[f"h{h}" for h in range(H)],
            showgrid=False,
            zeroline=False,
        ),
        plot_bgcolor="white",
        hovermode="closest",
        legend=dict(groupclick="toggleitem", tracegroupgap=12),
    )
    return fig


def _edge_traces(
    fig: go.Figure, g: _GraphLike, pos: dict, edges: list[tuple[tuple[str, str], float | None]], width_max: float
) -> None:
    """The edges: one line trace per (colour, width class), an invisible marker at each midpoint for
    the hover, and the legend of the colours drawn."""
    sj = {s: j for j, s in enumerate(g.slots)}
    top = max((abs(s) for _, s in edges if s is not None), default=0.0) or 1.0
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
        line = dict(color=colour, width=0.5 + width_max * (cls + 1) / 5)
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", hoverinfo="skip", showlegend=False, line=line, opacity=0.7))
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
    _edge_legend(fig, {colour for colour, _ in groups})


def _node_traces(fig: go.Figure, g: _GraphLike, pos: dict, names: list[str]) -> None:
    """One marker trace per node kind (input, heads, mixers, MLPs, per-layer embeddings, logits)."""
    kind_of = {"a": "attn", "x": "mixer", "m": "mlp", "p": "ple"}
    kinds = [n if n in (g.input_node, g.logits_node) else kind_of[n[0]] for n in names]
    every = _label_stride(g.n_layers)
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
                legendgroup="nodes",
                legendgrouptitle_text="nodes",
                text=[_node_label(n, kind, every) for n in sel],
                hovertext=sel,
                textposition="top center",
                textfont=dict(size=10),
                hoverinfo="text",
                marker=dict(size=14, color=_NODE_COLORS[kind], line=dict(width=1, color="#333")),
            )
        )


#: Pixels a plot is about wide, and what one node label needs: MLP labels are thinned to fit.
_PLOT_PX, _LABEL_PX = 1100.0, 34.0


def _label_stride(n_layers: int) -> int:
    """Label every k-th layer's MLP (and tick) so that labels ~_LABEL_PX wide never overlap."""
    per_layer = _PLOT_PX / (2 * n_layers + 2)
    return max(1, int(np.ceil(_LABEL_PX / (2 * per_layer))))


def _node_label(name: str, kind: str, every: int) -> str:
    """Input, logits, MLPs (every ``every``-th layer), mixers and PLE nodes are labelled; a head's
    name is its position (x: layer, y: head) and its hover."""
    if kind in ("input", "logits"):
        return name
    if kind == "attn":
        return ""
    layer = int(name[1:])
    return name if layer % every == 0 else ""


def _edge_legend(fig: go.Figure, colours: set[str]) -> None:
    """Legend entries for the edge colours drawn (lines carry no legend themselves)."""
    for colour, label in (
        (_POS, "score > 0: supports the answer"),
        (_NEG, "score < 0: works against it"),
        (_NONE, "no score"),
    ):
        if colour in colours:
            fig.add_trace(
                go.Scatter(
                    x=[None],
                    y=[None],
                    mode="lines",
                    name=label,
                    line=dict(color=colour, width=3),
                    legendgroup="edges",
                    legendgrouptitle_text="edges (width: |score|)",
                    hoverinfo="skip",
                )
            )


def edge_heatmap(
    circuit: _CircuitLike, *, abs: bool = False, mark_kept: bool = True, title: str | None = None, scale: str = "symlog"
) -> go.Figure:
    """Sources x slots heatmap of every edge's score (|score| with ``abs=True``), kept edges dotted.

    Edge scores are heavy tailed (a few edges carry most of the effect), so on a linear scale nearly
    every cell is white. ``scale="symlog"`` (default) colours by sign(s) * log10(1 + |s| / t), with
    ``t`` the 10th percentile of the scored edges' |score|: every order of magnitude gets its share of
    the colours, and the colour bar is labelled in scores. ``scale="linear"`` colours the score itself
    between +-the 99th percentile of |score| (the few beyond saturate). Positive scores are blue,
    negative red, as in :func:`plot_circuit`; hover shows the exact score. Axes are labelled once per
    layer (the hover names each source and slot); cells that are no edge are left blank.
    """
    if scale not in _SCALES:
        raise ValueError(f"scale must be one of {_SCALES}, got {scale!r}")
    g = circuit.graph
    edge = g.edge_mask.numpy()
    if circuit.scores is None:
        raw = circuit.mask.float().numpy()
        label = "kept"
    else:
        raw = circuit.scores.numpy().astype(float)
        raw = np.abs(raw) if abs else raw
        label = "|score|" if abs else "score"
    raw = np.where(edge, raw, np.nan)
    heat: dict = dict(colorscale="Blues", zmin=0.0, zmax=1.0, colorbar=dict(title=label))
    z = raw
    if circuit.scores is not None:
        z, heat = _score_colours(raw, label, abs=abs, scale=scale)
    src_layer = [_layer_of(n) for n in g.sources]
    slot_layer = [_layer_of(n) for n in g.slots]
    hover = np.array([[f"{a} → {b}" for b in g.slots] for a in g.sources], dtype=object)
    fig = go.Figure(
        go.Heatmap(
            z=z,
            customdata=np.dstack([hover, np.where(np.isfinite(raw), raw, np.nan).astype(object)]),
            hovertemplate="%{customdata[0]}<br>" + label + " %{customdata[1]:.4g}<extra></extra>",
            hoverongaps=False,
            **heat,
        )
    )
    if mark_kept and len(circuit):
        rows, cols = circuit.mask.nonzero(as_tuple=True)
        fig.add_trace(
            go.Scatter(
                x=cols.tolist(),
                y=rows.tolist(),
                mode="markers",
                name=f"kept ({len(circuit)} edges)",
                marker=dict(size=5, color="black", symbol="circle-open", line=dict(width=1.5)),
                hoverinfo="skip",
            )
        )
    fig.update_layout(
        title=title or f"Edge scores ({g.n_edges} edges, {len(circuit)} kept)",
        xaxis=dict(title="reading slot (q, k, v of each head, then the MLP; by layer)", **_layer_axis(slot_layer)),
        yaxis=dict(
            title="writing node (heads, then the MLP; by layer)", autorange="reversed", **_layer_axis(src_layer)
        ),
        plot_bgcolor="white",
        showlegend=True,
        legend=dict(orientation="h", x=1.0, xanchor="right", y=1.02, yanchor="bottom"),
    )
    return fig


def _score_colours(raw: np.ndarray, label: str, *, abs: bool, scale: str) -> tuple[np.ndarray, dict]:
    """The scores' colour values and the heatmap's colour settings (scale, range, colour bar)."""
    z = raw
    mag = np.abs(raw[np.isfinite(raw) & (raw != 0)])
    if scale == "symlog" and mag.size:
        t = float(np.quantile(mag, 0.1))
        z = np.sign(raw) * np.log10(1.0 + np.abs(raw) / t)
        lim = float(np.nanmax(np.abs(z)))
        tickvals, ticktext = _symlog_ticks(t, float(mag.max()), signed=not abs)
        bar = dict(
            title=f"{label}<br>(signed log)" if not abs else f"{label} (log)", tickvals=tickvals, ticktext=ticktext
        )
    else:
        lim = float(np.quantile(mag, 0.99)) if mag.size else 1.0
        bar = dict(title=label + (" (99th pct range)" if mag.size else ""))
    lim = lim or 1.0
    heat = dict(colorscale=_SEQUENTIAL if abs else _DIVERGING, zmin=0.0 if abs else -lim, zmax=lim, colorbar=bar)
    return z, heat


_SCALES = ("symlog", "linear")
# Red (negative) -> white -> blue (positive), as the circuit plot's edges; small magnitudes already tinted.
_DIVERGING = [
    [0.0, "#67001f"],
    [0.2, "#b2182b"],
    [0.4, "#ef8a62"],
    [0.48, "#fbe3d6"],
    [0.5, "#f7f7f7"],
    [0.52, "#d9e9f3"],
    [0.6, "#67a9cf"],
    [0.8, "#2166ac"],
    [1.0, "#053061"],
]
_SEQUENTIAL = [[0.0, "#f7fbff"], [0.05, "#c6dbef"], [0.4, "#4292c6"], [1.0, "#08306b"]]


def _layer_of(node: str) -> int | None:
    """The layer of a source or slot name (``a3.h1``, ``a3.h1<q``, ``m3``, ``x3``, ``p3``); None for input / logits."""
    head = node.split("<")[0].split(".")[0]
    return int(head[1:]) if head[:1] in "amxp" and head[1:].isdigit() else None


def _layer_axis(layers: list[int | None]) -> dict:
    """Ticks once per layer (at its first row / column; ``input`` / ``logits`` named), readable size."""
    rows: dict[int, list[int]] = {}
    for i, layer in enumerate(layers):
        if layer is not None:
            rows.setdefault(layer, []).append(i)
    step = max(1, int(np.ceil(len(rows) / 24)))
    vals = [(r[0] + r[-1]) / 2 for layer, r in rows.items() if layer % step == 0]  # the middle of its rows
    text = [f"L{layer}" for layer in rows if layer % step == 0]
    ends = [(i, "input" if i == 0 else "logits") for i, layer in enumerate(layers) if layer is None]
    for i, name in ends:  # named where it does not crowd a layer's label
        if all(abs(i - v) >= 0.02 * len(layers) for v in vals):
            vals.append(i)
            text.append(name)
    return dict(tickmode="array", tickvals=vals, ticktext=text, tickfont=dict(size=11), showgrid=False, zeroline=False)


def _symlog_ticks(t: float, top: float, *, signed: bool) -> tuple[list[float], list[str]]:
    """Colour-bar ticks of the signed-log scale at round scores (powers of ten between ``t`` and ``top``)."""
    lo, hi = int(np.floor(np.log10(t))), int(np.ceil(np.log10(top)))
    values = [10.0**k for k in range(lo, hi + 1) if 10.0**k <= top * 1.0001] or [top]
    vals = [float(np.log10(1 + v / t)) for v in values]
    text = [f"{v:.0e}".replace("e-0", "e-").replace("e+0", "e") for v in values]
    if not signed:
        return [0.0, *vals], ["0", *text]
    return [-v for v in vals[::-1]] + [0.0] + vals, ["-" + x for x in text[::-1]] + ["0"] + text
