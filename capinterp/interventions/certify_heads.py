"""Attention heads for :func:`capinterp.interventions.certify.certify`.

A head unit is its whole output ``z_h @ W_O[h]`` removed at every position: every edge out of the
head's node of the model's circuit graph ablated (``zero``: as if ``z_h`` were 0; ``mean``: its mean
output over the data), the single-head patch of :func:`capinterp.circuits.head_patching.head_effects`,
batched through :func:`capinterp.interventions.edge_faithfulness.edge_metric`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from capinterp.circuits.graph import Graph
from capinterp.circuits.head_patching import head_sources
from capinterp.core.protocol import Model
from capinterp.interventions.edge_faithfulness import edge_metric
from capinterp.units.base import KeySet

__all__ = ["head_graph", "head_metric", "head_units"]


def head_graph(model: Model) -> tuple[Graph, list[tuple[int, int]]]:
    """The model's circuit graph and its heads ``(layer, head)`` in :func:`head_sources` order."""
    graph = Graph.from_model(model)
    return graph, [(int(l), h) for l in graph.head_layers for h in range(graph.n_heads)]


def head_units(model: Model, located: KeySet, scores: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, Graph]:
    """Over the model's heads: in S, scores (``[n_layers, n_heads]`` or None), index; and the graph.
    ValueError for a key that is not a head ``(layer, head)`` of this model."""
    graph, heads = head_graph(model)
    keys = set()
    for k in located:
        if not (isinstance(k, tuple) and len(k) == 2 and (int(k[0]), int(k[1])) in set(heads)):
            raise ValueError(f"head {k!r} is not a (layer, head) of this model ({len(heads)} heads)")
        keys.add((int(k[0]), int(k[1])))
    inside = np.array([u in keys for u in heads], dtype=bool)
    s = np.zeros(len(heads))
    if scores is not None:
        t = np.asarray(torch.as_tensor(scores, dtype=torch.float64))
        if t.shape != (graph.n_layers, graph.n_heads):
            raise ValueError(f"head scores must be [{graph.n_layers}, {graph.n_heads}], got {t.shape}")
        s = np.array([t[l, h] for l, h in heads])
    return inside, s, np.arange(len(heads)), graph


def head_metric(model: Model, graph: Graph, items: list, ids: np.ndarray, ablation: str, bs: int) -> np.ndarray:
    """``[1 + len(ids)]`` mean p(target): the full model, then each head (``ids``: positions among
    :func:`head_graph`'s heads) ablated alone."""
    src = torch.tensor([graph.sources.index(a) for a, _ in graph.edges()])
    heads = head_sources(graph)
    kept = torch.ones(1 + len(ids), graph.n_edges, dtype=torch.bool)
    for j, u in enumerate(ids):
        kept[1 + j, src == heads[int(u)]] = False
    return edge_metric(model, graph, items, kept, ablation=ablation, metric="prob", batch_size=bs)
