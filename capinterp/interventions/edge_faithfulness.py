"""Faithfulness over circuit edges: the edge half of :func:`capinterp.interventions.faithfulness`.

Units are the edges ``(source node, input slot)`` of the model's circuit graph
(:class:`capinterp.circuits.Graph`). "Keep only the edges C" runs
:func:`capinterp.circuits.run_graph` with every other edge removed: the slot input of each
removed edge ``(u, v)`` reads ``resid(v) - (a_u - ref_u)``, where ``a_u`` is u's output in the same
(ablated) pass, so ablations compound downstream as in ACDC, and the residual stream itself is
untouched. ``ref_u`` is

* ``"mean"``: u's output averaged over the real tokens (prompt + target, no padding) of the
  reference data (the measured data unless ``reference=`` is given): first positions apart from
  the later ones (the attention sink, :mod:`capinterp.core.position_mean`), one ``[d_model]``
  vector per node for each;
* ``"zero"``: 0;
* ``"corrupt"``: u's output on the example's corrupted prompt (subject swap of
  :func:`capinterp.circuits.eap.make_pairs`) at the same position, from an unablated run.

Keeping every edge is the full model; keeping none leaves every slot input at the sum of the
reference outputs of its upstream nodes plus the constant biases. Each (edge set, example) pair is
one row of a batched :func:`run_graph` call (a removal set per row).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from capinterp.circuits.forward import check_additive, graph_mode, mean_outputs, run_graph
from capinterp.circuits.graph import Circuit, EdgeSet, Graph
from capinterp.core import distributed as dist
from capinterp.core import validate
from capinterp.core.position_mean import batch_rows
from capinterp.core.protocol import Model
from capinterp.core.tokens import Encoded, batches, encode, pad_id, pad_right
from capinterp.interventions.faithfulness_metric import corrupt_pairs, metric_rows

__all__ = ["edge_metric", "edge_ranking", "is_edge_input", "removal_masks"]


def is_edge_input(units: Any) -> bool:
    """Whether ``units`` is one of the edge inputs: a fitted KnowledgeCircuit, Circuit, EdgeSet, or
    a 2-D edge-score matrix ``[n_src, n_slots]``."""
    if isinstance(units, (Circuit, EdgeSet)):
        return True
    if getattr(units, "unit_kind", None) == "edge":
        return True
    return isinstance(units, (torch.Tensor, np.ndarray)) and np.ndim(units) == 2


def edge_ranking(model: Model, units: Any, by: str) -> tuple[Graph, torch.Tensor, int | None]:
    """``(graph, order, given)``: edge indices into ``graph.edges()`` (slot-major) best first, and
    the size of a given set (None for a full ranking by |score| or score)."""
    if getattr(units, "unit_kind", None) == "edge" and not isinstance(units, (Circuit, EdgeSet)):
        if getattr(units, "circuit_", None) is None:
            raise ValueError("the KnowledgeCircuit is not fitted: call .fit(facts) first")
        units = units.circuit_
    if isinstance(units, (torch.Tensor, np.ndarray)):
        graph = Graph.from_model(model)
        scores: torch.Tensor | None = torch.as_tensor(units).detach().cpu().double()
        if tuple(units.shape) != (graph.n_src, graph.n_slots):
            raise ValueError(
                f"edge scores must be [n_src, n_slots] = {(graph.n_src, graph.n_slots)} for this model's graph, "
                f"got {tuple(units.shape)}"
            )
    else:
        graph = units.graph
        if isinstance(units, Circuit):  # its graph and its model identity (saved results: issue 51)
            units.check_model(model)
        elif graph.signature != Graph.from_model(model, graph.granularity).signature:
            raise ValueError(f"the circuit's graph ({graph.signature}) is not this model's graph")
        scores = None if isinstance(units, EdgeSet) or units.scores is None else units.scores.double()
        if scores is None:  # a set without scores: its own edges, in graph order
            mask = graph.mask_of(units.keys()) if isinstance(units, EdgeSet) else units.mask
            pos = _flat(graph, mask).nonzero().flatten()
            return graph, pos, int(pos.numel())
    assert scores is not None
    flat = _flat(graph, scores)
    key = flat.abs() if by == "abs" else flat
    return graph, torch.sort(key, descending=True, stable=True).indices, None


def _flat(graph: Graph, matrix: torch.Tensor) -> torch.Tensor:
    """``[n_edges]``: the matrix's values on the edges, in ``graph.edges()`` order (slot-major)."""
    return matrix.T[graph.edge_mask.T]


def removal_masks(graph: Graph, kept: torch.Tensor) -> torch.Tensor:
    """Bool ``[C, n_src, n_slots]`` removed edges from bool ``[C, n_edges]`` kept edges."""
    out = torch.zeros(kept.shape[0], graph.n_slots, graph.n_src, dtype=torch.bool)
    out[:, graph.edge_mask.T] = ~kept
    return out.transpose(1, 2)


def _references(model: Model, graph: Graph, items: list[Encoded], ablation: str, reference: Any, corrupt: Any, bs: int):
    """``([2, n_src, d] or None, [n, T, n_src, d] or None, pairs)`` for mean / zero / corrupt (the mean's
    first row is for first positions, its second for the later ones: :mod:`capinterp.core.position_mean`)."""
    dev = model.cfg.device
    pad = pad_id(model.tokenizer)
    if ablation == "zero":
        return None, None, None
    if ablation == "mean":
        ref_items = items if reference is None else encode(model, validate.examples(reference, "reference"))
        padded = (pad_right([it.ids for it in chunk], pad) for chunk in batches(ref_items, bs))
        return mean_outputs(model, graph, ((t.to(dev), n) for t, n in padded)), None, None
    pairs = corrupt_pairs(model, items, corrupt)
    T = max(len(it.ids) for it in items)
    rows = torch.zeros(len(items), T, graph.n_src, int(model.cfg.d_model), device=dev)
    for s in range(0, len(pairs), bs):
        chunk = pairs[s : s + bs]
        tokens, _ = pad_right([p.corrupt_ids for p in chunk], pad)
        run = run_graph(model, graph, tokens.to(dev), logits=False)
        rows[s : s + len(chunk), : tokens.shape[1]] = run.outputs.float()
    return None, rows, pairs


@torch.no_grad()
def edge_metric(
    model: Model,
    graph: Graph,
    items: list[Encoded],
    kept: torch.Tensor,
    *,
    ablation: str,
    metric: str,
    reference: Any = None,
    corrupt: Any = "auto",
    batch_size: int = 16,
    per_example: bool = False,
) -> np.ndarray:
    """``[C]``: the metric averaged over ``items`` with only the edges ``kept`` (bool ``[C, n_edges]``,
    ``graph.edges()`` order) running and every other edge ablated (see the module docstring);
    ``per_example``: ``[C, n_items]``, unaveraged. Under ``torchrun`` the ranks share the batches
    (each rank every world_size-th), their values summed."""
    if kept.dim() != 2 or kept.shape[1] != graph.n_edges:
        raise ValueError(f"kept must be [n_configs, {graph.n_edges}], got {tuple(kept.shape)}")
    check_additive(model, graph)
    dev = model.cfg.device
    removed = removal_masks(graph, kept.bool()).to(dev)
    ids = pad_right([it.ids for it in items], pad_id(model.tokenizer))[0]
    last = torch.tensor([it.last_prompt_pos for it in items])
    jobs = [(c, i) for c in range(kept.shape[0]) for i in range(len(items))]
    out = torch.zeros(kept.shape[0], len(items), dtype=torch.float64)
    dist.init(dev)
    with graph_mode(model, graph):
        mean, rows, pairs = _references(model, graph, items, ablation, reference, corrupt, batch_size)
        for chunk in dist.shard(list(batches(jobs, batch_size))):
            cfg = torch.tensor([c for c, _ in chunk])
            ex = torch.tensor([i for _, i in chunk])
            toks = ids[ex].to(dev)
            B, T = toks.shape
            ref = None
            if mean is not None:
                ref = batch_rows(mean, B, T)
            elif rows is not None:
                ref = rows[ex.to(dev), :T]
            at = run_graph(model, graph, toks, removed=removed[cfg.to(dev)], ref=ref, at=last[ex]).logits
            vals = metric_rows(at, ex.tolist(), items, pairs, metric).double().cpu()
            out[cfg, ex] = vals
    out = dist.all_reduce_sum(out, dev)
    return out.numpy() if per_example else out.mean(1).numpy()
