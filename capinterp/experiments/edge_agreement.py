"""Circuit edges in the patching-agreement experiment: EAP and EAP-IG edge scores against exact
single-edge activation patching.

A score ``s(u -> v)`` of :func:`capinterp.circuits.eap.score_edges` is the first-order change of
the loss ``logit[corrupted answer] - logit[answer]`` when the edge alone carries its corrupted
value. The exact effect of the same edge is that change measured:
``m(full) - m(edge removed)``, with ``m = logit[answer] - logit[corrupted answer]`` and the edge's
source output replaced by its output on the subject-swapped prompt in the downstream slot's input
(:func:`capinterp.interventions.edge_faithfulness.edge_metric`, ``ablation="corrupt"``). The
edges compared are each method's top ``n_top`` by |score| plus ``n_random`` uniformly random ones.
Subject swaps are needed (facts with ``meta["subject"]``): only the examples that have one among
the others are used (:func:`swappable`); with fewer than two the task gets no edge rows.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import torch

from capinterp.circuits.eap import make_pairs, score_edges
from capinterp.circuits.graph import Graph
from capinterp.core.protocol import Model
from capinterp.core.tokens import encode
from capinterp.interventions.edge_faithfulness import edge_metric

__all__ = ["edge_effects", "edge_rows", "edge_scores", "edge_table", "swappable"]


def swappable(model: Model, data: Any) -> list:
    """The examples of ``data`` that each get a subject swap from another kept one
    (:func:`~capinterp.circuits.eap.make_pairs` run again on the kept ones until none falls back to
    noise); order kept."""
    kept = list(data)
    while kept:
        modes = [p.mode for p in make_pairs(model, kept)]
        if all(m == "swap" for m in modes):
            return kept
        kept = [e for e, m in zip(kept, modes) if m == "swap"]
    return kept


def edge_effects(model: Model, graph: Graph, data: Any, edges: list[int], batch_size: int = 16) -> np.ndarray:
    """``[len(edges)]``: m(full) - m(that edge alone corrupted), ``m`` the mean logit difference
    answer - corrupted answer; ``edges`` index ``graph.edges()``."""
    kept = torch.ones(len(edges) + 1, graph.n_edges, dtype=torch.bool)
    for i, e in enumerate(edges):
        kept[i + 1, e] = False
    items = encode(model, list(data))
    vals = edge_metric(model, graph, items, kept, ablation="corrupt", metric="logit_diff", batch_size=batch_size)
    return vals[0] - vals[1:]


def edge_scores(model: Model, graph: Graph, data: Any, steps: int, rule: str, batch_size: int = 16) -> np.ndarray:
    """``[n_edges]`` EAP (``steps=1``) or EAP-IG scores in ``graph.edges()`` order (logit-difference loss)."""
    pairs = make_pairs(model, list(data))
    matrix, _ = score_edges(model, graph, pairs, steps=steps, rule=rule, metric="logit_diff", batch_size=batch_size)
    return matrix.T[graph.edge_mask.T].double().numpy()  # slot-major, as graph.edges()


def edge_table(
    model: Model,
    data: Any,
    ig: dict[str, Any],
    *,
    n_top: int = 16,
    n_random: int = 16,
    seed: int = 0,
    batch_size: int = 16,
) -> tuple[dict[str, np.ndarray], np.ndarray, list[int], int] | None:
    """``(scores per method on the sampled edges, exact effects, sampled edge indices, examples
    used)``; None when fewer than two examples have a subject swap (a noise corruption cannot be
    replayed by patching)."""
    data = swappable(model, data)
    if len(data) < 2:
        return None
    graph = Graph.from_model(model)
    full = {
        "EAP": edge_scores(model, graph, data, 1, "right", batch_size),
        "EAP-IG": edge_scores(model, graph, data, ig["steps"], ig["rule"], batch_size),
    }
    gen = torch.Generator().manual_seed(int(seed))
    picked = set(torch.randperm(graph.n_edges, generator=gen)[:n_random].tolist())
    for s in full.values():
        picked |= set(np.argsort(-np.abs(s), kind="stable")[:n_top].tolist())
    edges = sorted(picked)
    effects = edge_effects(model, graph, data, edges, batch_size)
    return {m: s[edges] for m, s in full.items()}, effects, edges, len(data)


def edge_rows(task: str, found: tuple, stats: Any) -> pd.DataFrame:
    """Rows (component ``"circuit edge"``) of :func:`edge_table`'s result for the experiment's table;
    ``stats(scores, effects)``: ``(pearson, spearman)`` or a dict of columns (with intervals)."""
    scores, effects, _, _ = found
    rows = []
    for method, s in scores.items():
        got = stats(s, effects)
        cols = got if isinstance(got, dict) else {"pearson": got[0], "spearman": got[1]}
        rows.append(
            {
                "task": task,
                "component": "circuit edge",
                "method": method,
                **cols,
                "n_units": len(effects),
                "ablation": "corrupted",
            }
        )
    return pd.DataFrame(rows)
