"""The strongest paths of a circuit, from ``input`` to ``logits`` through its kept edges, best first.

A :class:`~capinterp.circuits.Circuit` keeps edges ``(source node, input slot)``
(:mod:`capinterp.circuits.graph`). A slot is read by one node (an MLP ``m{l}``, a head's query slot
``a{l}.h{h}<q``, ``logits``) or by several heads (a grouped key / value slot ``a{l}.g{g}<k`` feeds
every head of its group; a layer-wide slot ``a{l}`` every head of the layer). A **path** is a chain
``input -> n1 -> ... -> logits`` in which every step is a kept edge ``(u, slot)`` whose slot is read
by the next node; two edges from ``u`` into different slots of one head (its q and its v) make two
paths.

**Path score: the smallest |edge score| along the path** (its bottleneck). Edge scores (EAP /
EAP-IG attributions, ACDC's loss increases) estimate, each on its own, how much the metric changes
when that one edge is patched; they are not factors of a product. A product of scores would rank
paths by their length as much as by their edges (every factor below 1 shortens the list's long
paths, every factor above 1 favours them), and would change the order when all scores are
rescaled; the minimum does neither: a path is as strong as its weakest edge, the edge whose removal
cuts it. A circuit without scores (an :class:`~capinterp.circuits.EdgeSet`) gives every edge
weight 1, so all its paths tie. **Ties** (paths often share their weakest edge) are broken by the
paths' steps in the graph's topological order (source node, then slot, then reader): the first
differing step decides, the earlier one first, and a path that is a prefix comes first.

**Exact search** (no sampling): ``best[v]``, the best bottleneck of any path from ``v`` to the
sink, by dynamic programming over the DAG in reverse topological order; then a best-first search
over partial paths keyed by ``min(bottleneck so far, best[v])``, which is exactly the best score
any completion of the partial path reaches. Complete paths therefore leave the queue in the order
above (an A* search with an exact heuristic), and the search visits at most ``n x path length x
out-degree`` partial paths, however many paths the circuit holds.
:func:`best_paths` works on any DAG given as weighted arcs; :func:`strongest_paths` on a circuit.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from capinterp.core import validate

__all__ = ["CircuitPath", "best_paths", "circuit_arcs", "strongest_paths"]

SCORE_DEFINITION = "path score = the smallest |edge score| along the path (its bottleneck)"


@dataclass(frozen=True)
class CircuitPath:
    """One input-to-logits path: ``nodes`` (``input`` ... ``logits``), ``slots`` (the slot each step
    enters, one fewer than the nodes), ``edge_scores`` (each step's signed edge score; None without
    scores) and ``score`` (the smallest |edge score|; 1.0 without scores)."""

    nodes: tuple[str, ...]
    slots: tuple[str, ...]
    edge_scores: tuple[float, ...] | None
    score: float

    @property
    def edges(self) -> list[tuple[str, str]]:
        """The circuit's edge keys ``(source, slot)`` along the path."""
        return list(zip(self.nodes[:-1], self.slots))

    def __str__(self) -> str:
        return " -> ".join(self.nodes)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready values: the nodes, each step (source, slot, target, score), the score."""
        scores = self.edge_scores or (None,) * len(self.slots)
        steps = [
            {"source": a, "slot": s, "target": b, "score": None if x is None else float(x)}
            for a, s, b, x in zip(self.nodes[:-1], self.slots, self.nodes[1:], scores)
        ]
        return {"nodes": list(self.nodes), "steps": steps, "score": float(self.score)}


def _topological(nodes: list[Hashable], out: dict[Hashable, list[int]], arcs: Sequence[tuple]) -> list[Hashable]:
    """The nodes in a topological order (Kahn); ValueError naming a node on a cycle."""
    indeg = dict.fromkeys(nodes, 0)
    for _, v, _ in arcs:
        indeg[v] += 1
    ready = [u for u in nodes if indeg[u] == 0]
    order = []
    while ready:
        u = ready.pop()
        order.append(u)
        for a in out[u]:
            v = arcs[a][1]
            indeg[v] -= 1
            if indeg[v] == 0:
                ready.append(v)
    if len(order) < len(nodes):
        stuck = next(u for u in nodes if indeg[u] > 0)
        raise ValueError(f"the arcs hold a cycle (through {stuck!r}): paths are searched on a DAG only")
    return order


def best_paths(
    arcs: Sequence[tuple[Hashable, Hashable, float]], source: Hashable, sink: Hashable, n: int
) -> list[tuple[float, tuple[int, ...]]]:
    """The ``n`` best ``source -> sink`` paths of the DAG made of ``arcs`` (``(u, v, weight)``,
    weights >= 0, parallel arcs allowed), as ``(score, arc indices)``: score the smallest weight
    on the path, best first, ties by the arc indices (lexicographic; see the module docstring).
    Fewer than ``n`` when the DAG has fewer paths; ValueError for a cycle, a negative or non-finite
    weight, or no path at all."""
    n = validate.positive_int("n", n)
    out: dict[Hashable, list[int]] = {source: [], sink: []}
    for a, (u, v, w) in enumerate(arcs):
        if not (isinstance(w, (int, float)) and math.isfinite(w) and w >= 0):
            raise ValueError(f"arc {a} ({u!r} -> {v!r}) has weight {w!r}: weights must be finite and >= 0")
        out.setdefault(u, []).append(a)
        out.setdefault(v, [])
    order = _topological(list(out), out, arcs)
    best: dict[Hashable, float] = dict.fromkeys(out, -math.inf)
    best[sink] = math.inf
    for u in reversed(order):
        for a in out[u]:
            if u != sink:
                best[u] = max(best[u], min(float(arcs[a][2]), best[arcs[a][1]]))
    if best[source] == -math.inf:
        raise ValueError(f"no path from {source!r} to {sink!r} through the {len(arcs)} arcs")
    found: list[tuple[float, tuple[int, ...]]] = []
    queue: list[tuple[float, tuple[int, ...], Hashable, float]] = [(-best[source], (), source, math.inf)]
    while queue and len(found) < n:
        _, steps, u, low = heapq.heappop(queue)
        if u == sink:
            found.append((low, steps))
            continue
        for a in out[u]:
            v, w = arcs[a][1], float(arcs[a][2])
            if best[v] > -math.inf:
                b = min(low, w)
                heapq.heappush(queue, (-min(b, best[v]), (*steps, a), v, b))
    return found


def _edges_of(circuit: Any) -> tuple[Any, Any, Any]:
    """``(graph, mask, scores or None)`` of a Circuit or an EdgeSet (a KeySet with a ``graph``)."""
    from capinterp.circuits.graph import Circuit, EdgeSet

    if isinstance(circuit, Circuit):
        return circuit.graph, circuit.mask, circuit.scores
    if isinstance(circuit, EdgeSet):
        return circuit.graph, circuit.graph.mask_of(circuit.keys()), None
    raise TypeError(f"expected a Circuit or an EdgeSet, got {type(circuit).__name__}")


def circuit_arcs(circuit: Any) -> tuple[list[tuple[str, str, float]], list[tuple[str, float | None]]]:
    """The circuit's kept edges as node-to-node arcs ``(source, reader, |score|)`` (one arc per
    reader of the edge's slot; weight 1.0 without scores), sorted by the graph's topological order
    (source, slot, reader), and beside each arc its ``(slot, signed score or None)``."""
    graph, mask, scores = _edges_of(circuit)
    node_at = {name: i for i, name in enumerate(graph.nodes)}
    rows = []
    for i, j in (mask & graph.edge_mask).nonzero().tolist():
        s = None if scores is None else float(scores[i, j])
        if s is not None and not math.isfinite(s):
            raise ValueError(f"edge ({graph.sources[i]}, {graph.slots[j]}) has score {s}: scores must be finite")
        for reader in graph.slot_nodes(j):
            rows.append((i, j, node_at[reader], graph.sources[i], reader, s))
    rows.sort(key=lambda r: r[:3])
    arcs = [(src, reader, 1.0 if s is None else abs(s)) for _, _, _, src, reader, s in rows]
    return arcs, [(graph.slots[j], s) for _, j, _, _, _, s in rows]


def strongest_paths(circuit: Any, n: int = 10) -> list[CircuitPath]:
    """The ``n`` strongest ``input -> logits`` paths of a Circuit (or an EdgeSet, whose edges all
    weigh 1), best first (score and ties: see the module docstring). ValueError for a circuit
    without edges or one whose edges never connect the input to the logits."""
    from capinterp.circuits.graph import INPUT, LOGITS

    n = validate.positive_int("n", n)
    arcs, labels = circuit_arcs(circuit)
    if not arcs:
        raise ValueError("the circuit has no edges: there is no path from the input to the logits to describe")
    try:
        found = best_paths(arcs, INPUT, LOGITS, n)
    except ValueError as err:
        if not str(err).startswith("no path"):
            raise
        n_edges = len({(a[0], lab[0]) for a, lab in zip(arcs, labels)})
        raise ValueError(
            f"none of the circuit's {n_edges} edges lie on a path from {INPUT!r} to {LOGITS!r}: no path to "
            "describe (Circuit.pruned() drops such dead edges; locate with more edges, e.g. a larger top_n)"
        ) from None
    has_scores = labels[0][1] is not None
    out = []
    for score, steps in found:
        nodes = (INPUT, *(arcs[a][1] for a in steps))
        slots = tuple(labels[a][0] for a in steps)
        signed = tuple(float(labels[a][1]) for a in steps) if has_scores else None  # type: ignore[arg-type]
        out.append(CircuitPath(nodes, slots, signed, float(score)))
    return out
