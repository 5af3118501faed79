"""Plotly figures for neuron scores and located neuron sets.

Every function returns a ``plotly.graph_objects.Figure`` and never calls ``show()``. Inputs are read
by attribute, so this module imports no result type: a ``NeuronSet`` (anything with a bool
``.mask``), ``NeuronScores`` (anything with ``.scores``), or a raw ``[n_layers, d_mlp]`` tensor
(bool = a set, float = scores).

- :func:`neuron_heatmap`: layers (y, layer 0 at the bottom) x neuron blocks (x), binned as in
  CNL's Fig. 4 (Huang et al. 2025): a cell is max |score| over ``bin_size`` consecutive neurons
  (scores) or the number of located neurons in the block (sets).
- :func:`layer_profile`: bar chart of located neurons (or summed |score|) per layer.

On a model whose layers differ in width (dense layers between MoE layers: results record
``meta["layer_widths"]``) a narrower layer's padding is not a neuron: blocks of padding only are
left blank (their hover says padding), a block that ends in padding shows its real neurons only,
and the experts' dividers are drawn across the MoE layers only.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import plotly.graph_objects as go
import torch
from einops import rearrange

from capinterp.arch.family import width_mask

__all__ = ["default_bin_size", "layer_profile", "neuron_heatmap"]

_MAX_LISTED = 8
_RING_BLOCKS = 64  # a located set in at most this many blocks is also ringed (narrow blocks are easy to miss)


def default_bin_size(d_mlp: int, n_bins: int = 128) -> int:
    """ceil(d_mlp / n_bins): about ``n_bins`` blocks per layer."""
    return max(1, math.ceil(d_mlp / n_bins))


@dataclass
class _Neurons:
    """What a figure needs of a neuron result: a ``[n_layers, d_mlp]`` tensor, set or scores, metadata."""

    values: torch.Tensor
    is_set: bool
    name: str
    meta: dict = field(default_factory=dict)

    @property
    def label(self) -> str:
        return self.meta.get("method") or self.name


def _coerce(obj: Any) -> _Neurons:
    meta = dict(getattr(obj, "meta", None) or {})
    if isinstance(getattr(obj, "mask", None), torch.Tensor):
        return _Neurons(obj.mask.bool().cpu(), True, type(obj).__name__, meta)
    if isinstance(getattr(obj, "scores", None), torch.Tensor):
        return _Neurons(obj.scores.detach().float().cpu(), False, type(obj).__name__, meta)
    t = obj if isinstance(obj, torch.Tensor) else torch.as_tensor(np.asarray(obj))
    if t.dim() != 2:
        raise ValueError(f"expected a [n_layers, d_mlp] tensor, got shape {tuple(t.shape)}")
    is_set = t.dtype == torch.bool
    return _Neurons(t.cpu() if is_set else t.detach().float().cpu(), is_set, "NeuronSet" if is_set else "NeuronScores")


def neuron_heatmap(
    scores_or_set: Any,
    bin_size: int | None = None,
    title: str | None = None,
    abs: bool = True,
    selected: Any = None,
) -> go.Figure:
    """Binned layer x neuron heatmap, the located neurons marked.

    On a mixture-of-experts model (``meta["moe"]``, recorded by every result) dotted lines separate
    the experts, the x axis names them, blocks never straddle two, and the hover names each block's
    expert. Scores: cell (l, b) = max_{i in block b} |s(l, i)| (``abs=True``), or the signed score of that
    argmax neuron (``abs=False``, diverging colours centred at 0). Sets: cell = number of located
    neurons in the block. Blocks are ``bin_size`` consecutive neurons (default ceil(d_mlp / 128));
    the last block may be shorter. Hover: layer, neuron range, value, and the argmax neuron (scores)
    or the located neuron indices (sets). Where layers differ in width (``meta["layer_widths"]``:
    dense layers of a mixed dense / MoE model) the padding is not drawn (see the module's docstring).

    ``selected``: the located neurons to mark on the scores (a ``NeuronSet``, a bool
    ``[n_layers, d_mlp]`` mask, or ``(layer, index)`` pairs): each block holding any is circled, with
    a legend entry and the neurons in its hover. A fitted localizer passed as ``scores_or_set``
    (anything with ``scores_`` and ``neurons_``) draws its scores with its neurons marked.
    """
    if selected is None and _has(scores_or_set, "neurons_"):
        selected = scores_or_set.neurons_
    if _has(scores_or_set, "scores_"):
        scores_or_set = scores_or_set.scores_
    obj = _coerce(scores_or_set)
    n_layers, d_mlp = obj.values.shape
    blk = _Blocks.of(obj, bin_size)
    b, starts, ends = blk.b, blk.starts, blk.ends
    if obj.is_set:
        z, text = _set_cells(obj, blk)
        colorscale, zmid, cbar = "Blues", None, "located"
    else:
        z, text = _score_cells(obj, blk, abs)
        colorscale, zmid, cbar = ("Viridis", None, "max |score|") if abs else ("RdBu_r", 0.0, "score")
    if blk.widths is not None:  # blocks of padding only are not drawn
        z = np.where(blk.last < starts[None, :], np.nan, z.astype(np.float64))
    fig = go.Figure(
        go.Heatmap(
            z=z,
            x=(starts + ends) / 2,
            y=list(range(n_layers)),
            text=text,
            hovertemplate="%{text}<extra></extra>",
            colorscale=colorscale,
            zmid=zmid,
            colorbar={"title": {"text": cbar}},
        )
    )
    kind = "located neurons" if obj.is_set else ("max |score|" if abs else "score")
    moe_layers = None if blk.widths is None else [w == d_mlp for w in blk.widths]
    _mark_experts(fig, obj.meta.get("moe"), d_mlp, starts, moe_layers)
    if selected is not None:
        _mark_selected(fig, _selected_mask(selected, n_layers, d_mlp), b, starts, ends)
    elif obj.is_set and 0 < int((z > 0).sum()) <= _RING_BLOCKS:  # a small set: a few narrow blocks, ringed
        _mark_selected(fig, obj.values, b, starts, ends, "located")
    fig.update_layout(
        title=title or f"{obj.label}: {kind} per block of {b} neurons",
        xaxis_title=f"neuron (blocks of {b})",
        yaxis_title="layer",
    )
    return fig


@dataclass
class _Blocks:
    """The heatmap's blocks of ``b`` consecutive neurons: first and last neuron of each, and where
    layers differ in width, each layer's last real neuron per block (``last``)."""

    b: int
    starts: np.ndarray
    ends: np.ndarray
    widths: list[int] | None
    last: np.ndarray | None

    @classmethod
    def of(cls, obj: _Neurons, bin_size: int | None) -> _Blocks:
        n_layers, d_mlp = obj.values.shape
        b = default_bin_size(d_mlp) if bin_size is None else int(bin_size)
        moe = obj.meta.get("moe")
        if bin_size is None and moe:  # blocks never straddle two experts
            while int(moe["d_expert"]) % b or (moe.get("d_shared") and int(moe["d_shared"]) % b):
                b -= 1
        if b < 1:
            raise ValueError(f"bin_size must be >= 1, got {bin_size}")
        starts = np.arange(math.ceil(d_mlp / b)) * b
        ends = np.minimum(starts + b, d_mlp) - 1
        widths = _layer_widths(obj.meta, n_layers, d_mlp)
        # a block's last real neuron, per layer (< its start: a block of padding only)
        last = None if widths is None else np.minimum(ends[None, :], np.asarray(widths)[:, None] - 1)
        return cls(b, starts, ends, widths, last)

    @property
    def n_bins(self) -> int:
        return len(self.starts)

    def pad(self, d_mlp: int) -> int:
        """Neurons to append so that the blocks tile the layer."""
        return self.n_bins * self.b - d_mlp

    def head(self, layer: int, k: int) -> str | None:
        """The hover's start, or None for a block of padding only."""
        end = self.ends[k] if self.last is None else int(self.last[layer, k])
        return None if end < self.starts[k] else f"layer {layer}, neurons {self.starts[k]}-{end}, "

    def padding(self, layer: int, k: int) -> str:
        assert self.widths is not None
        return (
            f"layer {layer}, neurons {self.starts[k]}-{self.ends[k]}: padding "
            f"(layer {layer} has {self.widths[layer]} neurons)"
        )


def _set_cells(obj: _Neurons, blk: _Blocks) -> tuple[np.ndarray, list[list[str]]]:
    """A set's cells: located neurons per block, and the hover listing them."""
    n_layers, d_mlp = obj.values.shape
    b = blk.b
    blocks = rearrange(
        torch.nn.functional.pad(obj.values.to(torch.int64), (0, blk.pad(d_mlp))), "l (k b) -> l k b", b=b
    )
    text: list[list[str]] = []
    for layer in range(n_layers):
        row = []
        for k in range(blk.n_bins):
            hits = (blk.starts[k] + blocks[layer, k].nonzero().flatten()).tolist()
            listed = ", ".join(map(str, hits[:_MAX_LISTED])) + (", ..." if len(hits) > _MAX_LISTED else "")
            h = blk.head(layer, k)
            row.append(
                blk.padding(layer, k) if h is None else h + f"{len(hits)} located" + (f": {listed}" if hits else "")
            )
        text.append(row)
    return blocks.sum(-1).numpy(), text


def _score_cells(obj: _Neurons, blk: _Blocks, abs: bool) -> tuple[np.ndarray, list[list[str]]]:
    """Scores' cells: each block's max |score| (or that neuron's signed score), and the hover."""
    n_layers, d_mlp = obj.values.shape
    s = obj.values
    a = s.abs() if blk.widths is None else s.abs().masked_fill(~_valid(blk.widths, d_mlp), -1.0)
    mag = rearrange(torch.nn.functional.pad(a, (0, blk.pad(d_mlp)), value=-1.0), "l (k b) -> l k b", b=blk.b)
    vmax, arg = mag.max(-1)
    arg = arg + torch.as_tensor(blk.starts).view(1, -1)
    signed = s.gather(1, arg)
    text: list[list[str]] = []
    for layer in range(n_layers):
        row = []
        for k in range(blk.n_bins):
            h = blk.head(layer, k)
            i = int(arg[layer, k])
            if h is None:
                row.append(blk.padding(layer, k))
            elif abs:
                row.append(h + f"max |score| {float(vmax[layer, k]):.4g} at neuron {i}")
            else:
                row.append(h + f"score {float(signed[layer, k]):.4g} at neuron {i} (max |score| in block)")
        text.append(row)
    return (vmax if abs else signed).numpy(), text


def _has(obj: Any, attr: str) -> bool:
    """Whether ``obj`` has ``attr`` set (a localizer before ``fit`` raises or holds None)."""
    try:
        return getattr(obj, attr, None) is not None
    except (AttributeError, RuntimeError, ValueError):
        return False


def _selected_mask(selected: Any, n_layers: int, d_mlp: int) -> torch.Tensor:
    """``selected`` as a bool ``[n_layers, d_mlp]`` mask: a set (``.mask``), a bool tensor, or pairs."""
    mask = getattr(selected, "mask", selected)
    if isinstance(mask, torch.Tensor) and mask.dtype == torch.bool:
        if tuple(mask.shape) != (n_layers, d_mlp):
            raise ValueError(f"selected has shape {tuple(mask.shape)}, the scores {(n_layers, d_mlp)}")
        return mask.cpu()
    out = torch.zeros(n_layers, d_mlp, dtype=torch.bool)
    for key in selected:
        if not (isinstance(key, (tuple, list)) and len(key) == 2):
            raise TypeError(f"selected must be a NeuronSet, a bool mask or (layer, index) pairs, got {key!r}")
        layer, idx = int(key[0]), int(key[1])
        if not (0 <= layer < n_layers and 0 <= idx < d_mlp):
            raise ValueError(f"selected neuron {key!r} is outside {n_layers} layers x {d_mlp} neurons")
        out[layer, idx] = True
    return out


def _mark_selected(
    fig: go.Figure, mask: torch.Tensor, b: int, starts: np.ndarray, ends: np.ndarray, what: str = "selected"
) -> None:
    """A ring on every block holding selected neurons, one legend entry, the neurons in the hover."""
    xs: list[float] = []
    ys: list[int] = []
    text: list[list[int]] = []
    for layer, idx in mask.nonzero().tolist():
        k = idx // b
        if xs and ys[-1] == layer and xs[-1] == (starts[k] + ends[k]) / 2:
            text[-1].append(idx)
            continue
        xs.append((starts[k] + ends[k]) / 2)
        ys.append(layer)
        text.append([idx])
    listed = [
        f"layer {y}: {what} neuron{'s' * (len(t) > 1)} "
        + ", ".join(map(str, t[:_MAX_LISTED]))
        + ", ..." * (len(t) > _MAX_LISTED)
        for y, t in zip(ys, text)
    ]
    n = int(mask.sum())
    fig.add_trace(
        go.Scatter(
            x=xs,
            y=ys,
            mode="markers",
            name=f"{what} ({n} neuron{'s' * (n != 1)})",
            text=listed,
            hovertemplate="%{text}<extra></extra>",
            marker={"symbol": "circle-open", "size": 13, "color": "#e41a1c", "line": {"width": 2.5}},
            showlegend=True,
        )
    )
    fig.update_layout(legend={"orientation": "h", "x": 1.0, "xanchor": "right", "y": 1.02, "yanchor": "bottom"})
    n_layers, d_mlp = mask.shape  # the rings must not widen the axes past the heatmap
    c = (starts + ends) / 2  # plotly's cell edges lie halfway between the block centres
    half = [(c[1] - c[0]) / 2, (c[-1] - c[-2]) / 2] if len(c) > 1 else [b / 2, b / 2]
    fig.update_xaxes(range=[float(c[0] - half[0]), float(c[-1] + half[1])])
    fig.update_yaxes(range=[-0.5, n_layers - 0.5])


def _layer_widths(meta: dict, n_layers: int, d_mlp: int) -> list[int] | None:
    """Each layer's real neurons (``meta["layer_widths"]``, checked by :func:`width_mask`), or None
    when every layer has ``d_mlp``."""
    widths = meta.get("layer_widths")
    if not widths:
        return None
    width_mask(widths, (n_layers, d_mlp))  # ValueError for widths that do not fit
    return None if all(w == d_mlp for w in widths) else list(widths)


def _valid(widths: list[int], d_mlp: int) -> torch.Tensor:
    return width_mask(widths, (len(widths), d_mlp))


def _mark_experts(
    fig: go.Figure, moe: dict | None, d_mlp: int, starts: np.ndarray, moe_layers: list[bool] | None = None
) -> None:
    """On a mixture-of-experts model (results record ``meta["moe"]``): a line between experts, each
    expert's name under its neurons, and the expert of each block in the hover text; where only
    some layers have experts (``moe_layers``), the lines and hover names on those layers only."""
    if not moe or moe.get("n_experts", 0) * moe.get("d_expert", 0) + moe.get("d_shared", 0) != d_mlp:
        return
    d, n = int(moe["d_expert"]), int(moe["n_experts"])
    bounds = [e * d for e in range(n + 1)] + ([d_mlp] if moe.get("d_shared") else [])
    runs = _runs(moe_layers) if moe_layers is not None else None
    for x in bounds[1:-1]:
        if runs is None:
            fig.add_vline(x=x - 0.5, line_width=1, line_dash="dot", line_color="grey")
            continue
        for lo, hi in runs:  # across the MoE layers only
            fig.add_shape(
                type="line",
                x0=x - 0.5,
                x1=x - 0.5,
                y0=lo - 0.5,
                y1=hi + 0.5,
                xref="x",
                yref="y",
                line={"width": 1, "dash": "dot", "color": "grey"},
            )
    names = [f"expert {e}" for e in range(n)] + (["shared"] if moe.get("d_shared") else [])
    centres = [(lo + hi - 1) / 2 for lo, hi in itertools.pairwise(bounds)]
    step = max(1, len(names) // 16)  # at most ~16 labels
    fig.update_xaxes(tickmode="array", tickvals=centres[::step], ticktext=names[::step])
    trace = fig.data[0]
    experts = [names[int(i) // d] if i < n * d else "shared" for i in starts]  # the expert of a block's first neuron
    trace.text = [
        [f"{experts[k]}: {cell}" if moe_layers is None or moe_layers[layer] else cell for k, cell in enumerate(row)]
        for layer, row in enumerate(trace.text)
    ]


def _runs(flags: list[bool]) -> list[tuple[int, int]]:
    """``(first, last)`` of each run of consecutive True entries."""
    out: list[tuple[int, int]] = []
    for i, f in enumerate(flags):
        if f and out and out[-1][1] == i - 1:
            out[-1] = (out[-1][0], i)
        elif f:
            out.append((i, i))
    return out


def layer_profile(set_or_scores: Any, title: str | None = None) -> go.Figure:
    """Bars per layer: located-neuron counts (set) or summed |score| (scores)."""
    obj = _coerce(set_or_scores)
    if obj.is_set:
        y, ytitle = obj.values.sum(dim=1).numpy(), "located neurons"
    else:
        y, ytitle = obj.values.abs().sum(dim=1).numpy(), "sum |score|"
    fig = go.Figure(go.Bar(x=list(range(obj.values.shape[0])), y=y, hovertemplate="layer %{x}: %{y}<extra></extra>"))
    fig.update_layout(title=title or f"{obj.label}: {ytitle} per layer", xaxis_title="layer", yaxis_title=ytitle)
    return fig
