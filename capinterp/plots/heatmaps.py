"""Plotly figures for neuron scores and located neuron sets.

Every function returns a ``plotly.graph_objects.Figure`` and never calls ``show()``. Inputs are read
by attribute, so this module imports no result type: a ``NeuronSet`` (anything with a bool
``.mask``), ``NeuronScores`` (anything with ``.scores``), or a raw ``[n_layers, d_mlp]`` tensor
(bool = a set, float = scores).

- :func:`neuron_heatmap`: layers (y, layer 0 at the bottom) x neuron blocks (x), binned as in
  CNL's Fig. 4 (Huang et al. 2025): a cell is max |score| over ``bin_size`` consecutive neurons
  (scores) or the number of located neurons in the block (sets).
- :func:`layer_profile`: bar chart of located neurons (or summed |score|) per layer.
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

__all__ = ["default_bin_size", "layer_profile", "neuron_heatmap"]

_MAX_LISTED = 8


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
    scores_or_set: Any, bin_size: int | None = None, title: str | None = None, abs: bool = True
) -> go.Figure:
    """Binned layer x neuron heatmap.

    On a mixture-of-experts model (``meta["moe"]``, recorded by every result) dotted lines separate
    the experts, the x axis names them, blocks never straddle two, and the hover names each block's
    expert. Scores: cell (l, b) = max_{i in block b} |s(l, i)| (``abs=True``), or the signed score of that
    argmax neuron (``abs=False``, diverging colours centred at 0). Sets: cell = number of located
    neurons in the block. Blocks are ``bin_size`` consecutive neurons (default ceil(d_mlp / 128));
    the last block may be shorter. Hover: layer, neuron range, value, and the argmax neuron (scores)
    or the located neuron indices (sets).
    """
    obj = _coerce(scores_or_set)
    n_layers, d_mlp = obj.values.shape
    b = default_bin_size(d_mlp) if bin_size is None else int(bin_size)
    moe = obj.meta.get("moe")
    if bin_size is None and moe:  # blocks never straddle two experts
        while int(moe["d_expert"]) % b or (moe.get("d_shared") and int(moe["d_shared"]) % b):
            b -= 1
    if b < 1:
        raise ValueError(f"bin_size must be >= 1, got {bin_size}")
    n_bins = math.ceil(d_mlp / b)
    pad = n_bins * b - d_mlp
    starts = np.arange(n_bins) * b
    ends = np.minimum(starts + b, d_mlp) - 1
    text: list[list[str]] = []
    if obj.is_set:
        blocks = rearrange(torch.nn.functional.pad(obj.values.to(torch.int64), (0, pad)), "l (k b) -> l k b", b=b)
        z = blocks.sum(-1).numpy()
        for layer in range(n_layers):
            row = []
            for k in range(n_bins):
                hits = (starts[k] + blocks[layer, k].nonzero().flatten()).tolist()
                listed = ", ".join(map(str, hits[:_MAX_LISTED])) + (", ..." if len(hits) > _MAX_LISTED else "")
                row.append(
                    f"layer {layer}, neurons {starts[k]}-{ends[k]}, {len(hits)} located"
                    + (f": {listed}" if hits else "")
                )
            text.append(row)
        colorscale, zmid, cbar = "Blues", None, "located"
    else:
        s = obj.values
        mag = rearrange(torch.nn.functional.pad(s.abs(), (0, pad), value=-1.0), "l (k b) -> l k b", b=b)
        vmax, arg = mag.max(-1)
        arg = arg + torch.as_tensor(starts).view(1, -1)
        signed = s.gather(1, arg)
        z = (vmax if abs else signed).numpy()
        for layer in range(n_layers):
            row = []
            for k in range(n_bins):
                head = f"layer {layer}, neurons {starts[k]}-{ends[k]}, "
                a = int(arg[layer, k])
                if abs:
                    row.append(head + f"max |score| {float(vmax[layer, k]):.4g} at neuron {a}")
                else:
                    row.append(head + f"score {float(signed[layer, k]):.4g} at neuron {a} (max |score| in block)")
            text.append(row)
        colorscale, zmid, cbar = ("Viridis", None, "max |score|") if abs else ("RdBu_r", 0.0, "score")
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
    _mark_experts(fig, obj.meta.get("moe"), d_mlp, starts)
    fig.update_layout(
        title=title or f"{obj.label}: {kind} per block of {b} neurons",
        xaxis_title=f"neuron (blocks of {b})",
        yaxis_title="layer",
    )
    return fig


def _mark_experts(fig: go.Figure, moe: dict | None, d_mlp: int, starts: np.ndarray) -> None:
    """On a mixture-of-experts model (results record ``meta["moe"]``): a line between experts, each
    expert's name under its neurons, and the expert of each block in the hover text."""
    if not moe or moe.get("n_experts", 0) * moe.get("d_expert", 0) + moe.get("d_shared", 0) != d_mlp:
        return
    d, n = int(moe["d_expert"]), int(moe["n_experts"])
    bounds = [e * d for e in range(n + 1)] + ([d_mlp] if moe.get("d_shared") else [])
    for x in bounds[1:-1]:
        fig.add_vline(x=x - 0.5, line_width=1, line_dash="dot", line_color="grey")
    names = [f"expert {e}" for e in range(n)] + (["shared"] if moe.get("d_shared") else [])
    centres = [(lo + hi - 1) / 2 for lo, hi in itertools.pairwise(bounds)]
    step = max(1, len(names) // 16)  # at most ~16 labels
    fig.update_xaxes(tickmode="array", tickvals=centres[::step], ticktext=names[::step])
    trace = fig.data[0]
    experts = [names[int(i) // d] if i < n * d else "shared" for i in starts]  # the expert of a block's first neuron
    trace.text = [[f"{experts[k]}: {cell}" for k, cell in enumerate(row)] for row in trace.text]


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
