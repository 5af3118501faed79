"""ACDC-style greedy edge pruning with zero ablation and the MatchNLL metric (the KC "acdc" path).

``MatchNLL(G') = mean over all target tokens of [NLL_G'(token) - NLL_full(token)]``: the extra
negative log-likelihood of the answer caused by the ablations (teacher forced over the whole
target, as in the KC code; here averaged over target tokens only, not padded with zeros over the
other positions, which only rescales the threshold).

Slots are visited in reverse topological order (``logits`` first, then the last MLP, the last
layer's attention slots, ...), and a slot's incoming edges from the latest source back to
``input``. Each edge is removed on trial; ``delta = MatchNLL(with it removed) - MatchNLL(now)``;
if ``delta < threshold`` it stays removed, otherwise it is restored. The trial delta is the edge's score.

Cost: one pass over the facts per edge, so ``n_edges`` passes: 343 on the 4-layer tiny test model,
70,651 on SmolLM2-135M (far too many for a CPU: the time per trial is in docs/results.md,
"Knowledge circuits"). With ``route="layer"`` (the default ``"auto"`` where
:func:`~capinterp.circuits.acdc_layer.layer_route` allows it) a trial into a slot of layer ``l``
runs only the blocks from ``l`` up, from a pass recorded once at the start, and unembeds only the
answer positions (:mod:`capinterp.circuits.acdc_layer`); ``route="full"`` runs every trial as one
whole graph forward. Both give the same decisions (benchmarks/bench_acdc.py times them).
Pass ``candidates`` (e.g. the top edges of EAP-IG) to visit only those; the other edges start
removed, which is only meaningful when the candidates alone keep the behaviour: ``info`` reports
``match_nll_start`` and a RuntimeWarning flags a start above 1 nat.
"""

from __future__ import annotations

import time
import warnings
from typing import Any

import torch

from capinterp.circuits.acdc_layer import LayerTrials, layer_route, slot_layer
from capinterp.circuits.forward import graph_mode, run_graph
from capinterp.circuits.graph import Graph
from capinterp.core.example import as_examples
from capinterp.core.protocol import Model
from capinterp.core.tokens import EncodedBatch, batches, collate, encode, pad_id
from capinterp.kernels.prefix import Unsupported

__all__ = ["acdc", "match_nll"]


def _token_nll(logits: torch.Tensor, batch: EncodedBatch) -> torch.Tensor:
    logp = torch.log_softmax(logits.float(), dim=-1)
    out = []
    for b, it in enumerate(batch.items):
        pos = torch.tensor(it.answer_positions, device=logits.device)
        out.append(-logp[b, pos, torch.tensor(it.target_ids, device=logits.device)])
    return torch.cat(out)


def _nll(model: Model, graph: Graph, chunks: list[EncodedBatch], removed: torch.Tensor | None) -> torch.Tensor:
    return torch.cat([_token_nll(run_graph(model, graph, b.tokens, removed=removed).logits, b) for b in chunks])


@torch.no_grad()
def match_nll(model: Model, graph: Graph, facts: Any, removed: torch.Tensor, *, batch_size: int = 16) -> float:
    """MatchNLL of the model with ``removed`` edges zero-ablated (0 when nothing is removed)."""
    chunks = _chunks(model, facts, batch_size)
    with graph_mode(model, graph):
        return float((_nll(model, graph, chunks, removed) - _nll(model, graph, chunks, None)).mean())


def _chunks(model: Model, facts: Any, batch_size: int) -> list[EncodedBatch]:
    items = encode(model, as_examples(facts))
    if not items:
        raise ValueError("ACDC needs at least one fact")
    dev = next(model.parameters()).device
    return [collate(c, pad_id(model.tokenizer), device=dev) for c in batches(items, batch_size)]


@torch.no_grad()
def acdc(
    model: Model,
    graph: Graph,
    facts: Any,
    *,
    threshold: float = 0.01,
    candidates: torch.Tensor | None = None,
    batch_size: int = 16,
    progress: bool = False,
    route: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """Greedy reverse-topological pruning. Returns ``(kept mask, trial deltas, info)``.

    ``kept`` is bool ``[n_src, n_slots]`` (dead nodes not yet pruned); ``deltas`` holds each visited
    edge's trial delta (0 for edges not visited). ``route``: ``"layer"`` (trials from the tried
    slot's layer up), ``"full"`` (a whole forward per trial) or ``"auto"`` (``"layer"`` where the
    model allows it); ``info["route"]`` says which ran.
    """
    if threshold < 0:
        raise ValueError(f"threshold must be >= 0, got {threshold}")
    route = _pick_route(model, graph, route)
    chunks = _chunks(model, facts, batch_size)
    em = graph.edge_mask
    visit = em if candidates is None else (candidates.bool() & em)
    removed = em & ~visit
    deltas = torch.zeros(graph.n_src, graph.n_slots)
    order = [
        (i, j) for j in reversed(range(graph.n_slots)) for i in reversed(range(graph.n_upstream(j))) if visit[i, j]
    ]
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(order), desc="ACDC", unit="edge")
    t0 = time.perf_counter()
    with graph_mode(model, graph):
        full = _nll(model, graph, chunks, None)
        trials, start_nll = _start(model, graph, chunks, removed, route)
        route = "full" if trials is None else "layer"
        cur = float((start_nll - full).mean())
        start = cur
        for i, j in order:
            removed[i, j] = True
            now = _nll(model, graph, chunks, removed) if trials is None else trials.nll(removed, slot_layer(graph, j))
            new = float((now - full).mean())
            deltas[i, j] = new - cur
            if new - cur < threshold:
                cur = new
            else:
                removed[i, j] = False
            if bar is not None:
                bar.update(1)
    if bar is not None:
        bar.close()
    if candidates is not None and start > 1.0:
        warnings.warn(
            f"with only the candidate edges kept, MatchNLL is already {start:.2f} nats: the "
            "candidates do not carry the behaviour and the greedy pass is not meaningful; "
            "give more candidates",
            RuntimeWarning,
            stacklevel=2,
        )
    info = {
        "threshold": threshold,
        "n_forward": len(order) + 2 + (route == "layer"),
        "seconds": time.perf_counter() - t0,
        "match_nll_start": start,
        "match_nll": cur,
        "n_visited": len(order),
        "route": route,
    }
    return em & ~removed, deltas, info


def _pick_route(model: Model, graph: Graph, route: str) -> str:
    """``"auto"``, ``"layer"`` or ``"full"``; ValueError for an unknown route or ``"layer"`` where it does not apply."""
    if route not in ("auto", "layer", "full"):
        raise ValueError(f"route must be 'auto', 'layer' or 'full', got {route!r}")
    if route == "full" or layer_route(model, graph):
        return route
    if route == "layer":
        raise ValueError(
            "route='layer' needs one residual stream, no layer scales, per-layer embeddings or hybrid mixers "
            "(capinterp.circuits.acdc_layer.layer_route); use route='full'"
        )
    return "full"


def _start(
    model: Model, graph: Graph, chunks: list[EncodedBatch], removed: torch.Tensor, route: str
) -> tuple[LayerTrials | None, torch.Tensor]:
    """The trials' recorded start (None on the full route) and the start's per-token NLL. With ``"auto"``,
    a model whose blocks cannot be called from a recorded input, or whose direct block calls do not give the start's
    NLL back (:class:`~capinterp.kernels.prefix.Unsupported`), falls back to the full route."""
    if route != "full":
        try:  # the start's pass, recorded: no removal below a visited slot's layer changes during its trials
            trials = LayerTrials(model, graph, chunks, removed)
            start = torch.cat([_token_nll(lg, b) for lg, b in zip(trials.start_logits, chunks)])
            if not torch.allclose(trials.nll(removed, 0), start, rtol=1e-4, atol=1e-4):
                raise Unsupported("calling the blocks from their recorded inputs does not reproduce the forward")
        except Unsupported:
            if route == "layer":
                raise
        else:
            return trials, start
    return None, _nll(model, graph, chunks, removed)
