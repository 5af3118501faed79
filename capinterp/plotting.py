"""Plotly figures for neuron scores, located sets and set-overlap matrices.

Every function returns a ``plotly.graph_objects.Figure`` and never calls ``show()``.

- :func:`neuron_heatmap`: layers (y, layer 0 at the bottom) x neuron blocks (x), binned as in
  CNL's Fig. 4: a cell is max |score| over ``bin_size`` consecutive neurons (scores) or the number
  of located neurons in the block (sets).
- :func:`overlap_matrix`: annotated square heatmap of a pairwise metric between named sets.
- :func:`layer_profile`: bar chart of located neurons (or summed |score|) per layer.
"""
from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import numpy as np
import plotly.graph_objects as go
import torch

from .metrics import METRICS, SetLike, intersection_size, pairwise
from .neurons import NeuronScores, NeuronSet

__all__ = ["neuron_heatmap", "overlap_matrix", "layer_profile", "default_bin_size"]

_MAX_LISTED = 8


def default_bin_size(d_mlp: int, n_bins: int = 128) -> int:
    """ceil(d_mlp / n_bins): about ``n_bins`` blocks per layer."""
    return max(1, math.ceil(d_mlp / n_bins))


def _coerce(obj: Any) -> NeuronScores | NeuronSet:
    if isinstance(obj, (NeuronScores, NeuronSet)):
        return obj
    t = obj if isinstance(obj, torch.Tensor) else torch.as_tensor(np.asarray(obj))
    return NeuronSet(t) if t.dtype == torch.bool else NeuronScores(t)


def neuron_heatmap(scores_or_set: Any, bin_size: int | None = None, title: str | None = None,
                   abs: bool = True) -> go.Figure:  # noqa: A002 - the documented argument name
    """Binned layer x neuron heatmap.

    Scores: cell (l, b) = max_{i in block b} |s(l, i)| (``abs=True``), or the signed score of that
    argmax neuron (``abs=False``, diverging colours centred at 0). Sets: cell = number of located
    neurons in the block. Blocks are ``bin_size`` consecutive neurons (default ceil(d_mlp / 128));
    the last block may be shorter. Hover: layer, neuron range, value, and the argmax neuron (scores)
    or the located neuron indices (sets).
    """
    obj = _coerce(scores_or_set)
    n_layers, d_mlp = obj.shape
    b = default_bin_size(d_mlp) if bin_size is None else int(bin_size)
    if b < 1:
        raise ValueError(f"bin_size must be >= 1, got {bin_size}")
    n_bins = math.ceil(d_mlp / b)
    pad = n_bins * b - d_mlp
    starts = np.arange(n_bins) * b
    ends = np.minimum(starts + b, d_mlp) - 1
    text: list[list[str]] = []
    if isinstance(obj, NeuronSet):
        blocks = torch.nn.functional.pad(obj.mask.to(torch.int64), (0, pad)).view(n_layers, n_bins, b)
        z = blocks.sum(-1).numpy()
        for layer in range(n_layers):
            row = []
            for k in range(n_bins):
                hits = (starts[k] + blocks[layer, k].nonzero().flatten()).tolist()
                listed = ", ".join(map(str, hits[:_MAX_LISTED])) + (", ..." if len(hits) > _MAX_LISTED else "")
                row.append(f"layer {layer}, neurons {starts[k]}-{ends[k]}, {len(hits)} located"
                           + (f": {listed}" if hits else ""))
            text.append(row)
        colorscale, zmid, cbar = "Blues", None, "located"
    else:
        s = obj.scores
        mag = torch.nn.functional.pad(s.abs(), (0, pad), value=-1.0).view(n_layers, n_bins, b)
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
    fig = go.Figure(go.Heatmap(
        z=z, x=(starts + ends) / 2, y=list(range(n_layers)), text=text,
        hovertemplate="%{text}<extra></extra>", colorscale=colorscale, zmid=zmid,
        colorbar={"title": {"text": cbar}},
    ))
    kind = "located neurons" if isinstance(obj, NeuronSet) else ("max |score|" if abs else "score")
    fig.update_layout(
        title=title or f"{obj.meta.get('method') or type(obj).__name__}: {kind} per block of {b} neurons",
        xaxis_title=f"neuron (blocks of {b})", yaxis_title="layer",
    )
    return fig


def overlap_matrix(sets: Mapping[Hashable, SetLike] | Sequence[SetLike], metric: str = "overlap",
                   title: str | None = None) -> go.Figure:
    """Annotated square heatmap of ``metrics.pairwise(sets, metric)``; hover adds the set sizes."""
    named = dict(sets) if isinstance(sets, Mapping) else dict(enumerate(sets))
    df = pairwise(named, metric)
    keys = list(named)
    names = [str(k) for k in keys]
    z = df.to_numpy(dtype=float)
    label = metric if isinstance(metric, str) else getattr(metric, "__name__", "metric")
    hover = [[f"{names[r]} vs {names[c]}: {label} {z[r, c]:.3f} "
              f"(|A∩B|={intersection_size(named[keys[r]], named[keys[c]])}, "
              f"|A|={len(named[keys[r]])}, |B|={len(named[keys[c]])})"
              for c in range(len(keys))] for r in range(len(keys))]
    bounded = isinstance(metric, str) and metric in METRICS and metric != "intersection"
    fig = go.Figure(go.Heatmap(
        z=z, x=names, y=names, text=[[f"{v:.2f}" for v in row] for row in z], texttemplate="%{text}",
        customdata=hover, hovertemplate="%{customdata}<extra></extra>", colorscale="Blues",
        zmin=0.0 if bounded else None, zmax=1.0 if bounded else None,
        colorbar={"title": {"text": label}},
    ))
    fig.update_layout(title=title or f"pairwise {label}", xaxis_title="set", yaxis_title="set",
                      yaxis={"autorange": "reversed"})
    return fig


def layer_profile(set_or_scores: Any, title: str | None = None) -> go.Figure:
    """Bars per layer: located-neuron counts (set) or summed |score| (scores)."""
    obj = _coerce(set_or_scores)
    if isinstance(obj, NeuronSet):
        y, ytitle = obj.per_layer().numpy(), "located neurons"
    else:
        y, ytitle = obj.scores.abs().sum(dim=1).numpy(), "sum |score|"
    fig = go.Figure(go.Bar(x=list(range(obj.n_layers)), y=y,
                           hovertemplate="layer %{x}: %{y}<extra></extra>"))
    fig.update_layout(title=title or f"{obj.meta.get('method') or type(obj).__name__}: {ytitle} per layer",
                      xaxis_title="layer", yaxis_title=ytitle)
    return fig
