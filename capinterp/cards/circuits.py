"""Circuit cards: the strongest input-to-logits paths of a circuit, and a card for each node on them.

>>> kc = ci.KnowledgeCircuit(model, top_n=200).fit(facts)
>>> cards = ci.describe(model, kc, task=facts, top=10)   # 10 path cards, then their nodes' cards

:func:`circuit_plan` reads a fitted :class:`~capinterp.localizers.knowledge_circuit.KnowledgeCircuit`
(its ``circuit_``, with every edge's score), a :class:`~capinterp.circuits.Circuit`, an edge set
(``kc.units_``, or a saved edge KeySet: its edges all weigh 1) or a node KeySet (node names such as
``"m3"``, ``"a1.h0"``). It checks the input against the model and finds the ``top`` strongest
paths (:func:`capinterp.cards.circuit_paths.strongest_paths`: the score of a path is its smallest
|edge score|) before any forward pass: an empty circuit, or one with no path from the input to
the logits, is a ValueError.

:func:`circuit_cards` (the builder :func:`capinterp.cards.describe` calls for kinds ``"edge"`` and
``"node"``) returns the **path cards** first (kind ``"path"``, unit the path's rank, ``score`` the
path score; ``details``: the nodes and each step's slot and signed edge score, and the index of
each node's card), then one **node card** per node on the paths (kind ``"node"``, unit the node's
name, in order of first appearance). A node card of an MLP ``m{l}`` carries the layer card of
layer ``l`` (:func:`capinterp.cards.describe` ``_layer_cards``: top contexts and statistics of
``||mlp_out||``), ablated on the task for the first :data:`ABLATE_NODES` MLP nodes (all the
layer's neurons erased); a head ``a{l}.h{h}`` carries the head card of ``(l, h)`` when a ``"head"``
builder is registered in ``describe.BUILDERS``, otherwise only its edges and a note; ``input`` and
``logits`` get no card, nor do mixer (``x{l}``) and per-layer-embedding (``p{l}``) nodes beyond
their edges. Each node card's ``details`` lists the paths through it and its strongest kept edges
in and out. Path cards are not ablated (``ablation`` None).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any

from capinterp.cards.card import UnitCard
from capinterp.cards.circuit_paths import SCORE_DEFINITION, CircuitPath, strongest_paths
from capinterp.cards.plan import Plan
from capinterp.core.example import Example

__all__ = [
    "ABLATE_NODES",
    "CircuitPlan",
    "circuit_cards",
    "circuit_plan",
    "circuit_section",
    "edge_granularity",
    "is_circuit",
]

#: MLP node cards ablated on the task (the first ones, in card order).
ABLATE_NODES = 10
#: Kept edges listed in and out of each node card (strongest |score| first).
EDGES_LISTED = 8
_HEAD = re.compile(r"a(\d+)\.h(\d+)$")


@dataclass
class CircuitPlan(Plan):
    """A :class:`~capinterp.cards.plan.Plan` for a circuit: ``keys`` are the strongest paths
    (kind ``"edge"``) or the node names (kind ``"node"``); ``circuit`` the Circuit (None for nodes)."""

    circuit: Any = None
    graph: Any = None


def is_circuit(units: Any) -> bool:
    """Whether ``units`` is a Circuit or an edge / node KeySet (what :func:`circuit_plan` reads)."""
    from capinterp.circuits.graph import Circuit
    from capinterp.units.base import KeySet

    return isinstance(units, Circuit) or (isinstance(units, KeySet) and units.kind in ("edge", "node"))


def edge_granularity(space: Any) -> str:
    """The graph granularity an edge set's space names (an EdgeSet's space is ``("edge",)`` plus its
    graph's signature, which a saved set keeps); ValueError for a space that names no graph."""
    from capinterp.circuits.graph import GRANULARITIES

    if not (isinstance(space, tuple) and len(space) >= 5 and space[0] == "edge" and space[4] in GRANULARITIES):
        raise ValueError(
            f"these edge units name no circuit graph (their space is {space!r}): describe a saved Circuit "
            "(Circuit.save, or the knowledge_circuit.json of 'capinterp localize') or an EdgeSet's saved KeySet"
        )
    return str(space[4])


def _keyset_circuit(model: Any, units: Any, across: bool) -> Any:
    """A Circuit (no scores) of an edge set, checked against the model's graph."""
    from capinterp.circuits.graph import Circuit, EdgeSet, Graph

    units.check_model(model, across_models=across)
    if isinstance(units, EdgeSet):
        graph = units.graph
    else:  # a saved edge KeySet: its space is ("edge",) + the graph's signature
        graph = Graph.from_model(model, edge_granularity(units.space))
        if ("edge",) + graph.signature != units.space:
            raise ValueError(f"the edge set's graph {units.space[1:]} is not this model's graph {graph.signature}")
    if graph.signature != Graph.from_model(model, graph.granularity).signature:
        raise ValueError(f"the edge set's graph {graph.signature} is not this model's graph")
    try:
        mask = graph.mask_of(units.keys())
    except (KeyError, ValueError, TypeError) as err:
        raise ValueError(f"the edge set holds a key that is no edge of the model's graph: {err}") from None
    return Circuit(graph, mask, None, dict(units.meta))


def _node_plan(model: Any, units: Any, top: int, across: bool) -> CircuitPlan:
    from capinterp.circuits.graph import INPUT, LOGITS, Graph

    units.check_model(model, across_models=across)
    graph = Graph.from_model(model)
    members = frozenset(units.keys())
    bad = sorted(str(k) for k in members if k not in graph.nodes)
    if bad:
        raise ValueError(f"node set: {bad[:3]} are no nodes of this model's graph (e.g. 'm0', 'a0.h0')")
    nodes = [n for n in graph.nodes if n in members and n not in (INPUT, LOGITS)]
    if not nodes:
        raise ValueError("the node set holds no node with a card (input and logits have none): nothing to describe")
    return CircuitPlan("node", nodes[:top], None, len(members), "node KeySet", graph=graph)


def circuit_plan(model: Any, units: Any, top: int, *, across_models: bool = False) -> CircuitPlan:
    """The paths (or nodes) to describe, checked before any forward pass (see the module docstring)."""
    from capinterp.circuits.graph import Circuit
    from capinterp.localizers.base import Localizer
    from capinterp.units.base import KeySet

    if isinstance(units, Localizer):
        circuit = getattr(units, "circuit_", None)
        if circuit is None:
            raise ValueError(f"{type(units).__name__} is not fitted yet: call .fit(data) first, then describe it")
        source = f"fitted {type(units).__name__}"
    elif isinstance(units, Circuit):
        circuit, source = units, "Circuit"
    elif isinstance(units, KeySet) and units.kind == "node":
        return _node_plan(model, units, top, across_models)
    elif isinstance(units, KeySet) and units.kind == "edge":
        circuit, source = _keyset_circuit(model, units, across_models), "edge set (every edge weighs 1)"
    else:
        raise TypeError(f"expected a circuit, an edge or node set or a fitted circuit localizer, got {type(units)}")
    circuit.check_model(model, across_models=across_models)
    paths = strongest_paths(circuit, top)
    scores = {p: p.score for p in paths} if circuit.scores is not None else None
    return CircuitPlan("edge", paths, scores, len(circuit), source, circuit=circuit, graph=circuit.graph)


def _node_kind(name: str) -> str:
    return {"m": "mlp", "a": "head", "x": "mixer", "p": "ple"}[name[0]]


def _inner_cards(
    model: Any, plan: Plan, nodes: list[str], corpus: list[str], examples: list[Example] | None, ablate: int, **kw: Any
) -> dict[str, UnitCard]:
    """Node name -> the layer card of an MLP node, the head card of a head node (when head cards exist)."""
    import importlib

    d = importlib.import_module("capinterp.cards.describe")  # the package exports the function describe

    out: dict[str, UnitCard] = {}
    mlps = [n for n in nodes if _node_kind(n) == "mlp"]
    if mlps:
        layers = [int(n[1:]) for n in mlps]
        n = ablate if examples and all(e.target for e in examples) else 0
        layer_plan = Plan("layer", layers, None, len(layers), plan.source)
        cards = d._layer_cards(model, layer_plan, corpus, examples, ablate=n, **kw)
        out.update(zip(mlps, cards))
    heads = [n for n in nodes if _node_kind(n) == "head"]
    if heads and "head" in d.BUILDERS:
        keys = [(int(m[1]), int(m[2])) for m in (_HEAD.match(n) for n in heads) if m]
        head_plan = Plan("head", keys, None, len(keys), plan.source)
        cards = d._builder("head")(model, head_plan, corpus, examples, ablate=ablate, **kw)
        by_unit = {tuple(c.unit): c for c in cards}
        out.update({n: by_unit[key] for n, key in zip(heads, keys) if key in by_unit})
    return out


def _edges_around(circuit: Any, name: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The circuit's kept edges into and out of node ``name``, strongest |score| first."""
    if circuit is None:
        return [], []
    g = circuit.graph
    slot_at = {s: j for j, s in enumerate(g.slots)}
    into, out = [], []
    for (src, slot), s in circuit.edges.items():
        row = {"source": src, "slot": slot, "score": s}
        if src == name:
            out.append({**row, "targets": list(g.slot_nodes(slot_at[slot]))})
        if name in g.slot_nodes(slot_at[slot]):
            into.append(row)

    def strongest(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return sorted(rows, key=lambda r: -abs(r["score"]) if r["score"] is not None else 0.0)[:EDGES_LISTED]

    return strongest(into), strongest(out)


NOTES = {
    "head": "no head card: head cards are not available in this installation; the node's edges only",
    "mixer": "a mixer node (Mamba, linear attention or convolution): no card of its own; its edges only",
    "ple": "a per-layer embedding node: no card of its own; its edges only",
}


def _node_card(name: str, inner: UnitCard | None, plan: Plan, paths: list[int]) -> UnitCard:
    ins, outs = _edges_around(getattr(plan, "circuit", None), name)
    details = {
        "node": name,
        "node_kind": _node_kind(name),
        "paths": [p + 1 for p in paths],
        "path_cards": list(paths),
        "edges_in": ins,
        "edges_out": outs,
        "described_as": None if inner is None else {"kind": inner.kind, "label": inner.label},
        "note": None if inner is not None else NOTES.get(_node_kind(name)),
        "inner": {} if inner is None else dict(inner.details),
    }
    if inner is None:
        return UnitCard(name, "node", details=details)
    return dataclasses.replace(inner, unit=name, kind="node", score=None, details=details)


def circuit_cards(
    model: Any,
    plan: Plan,
    corpus: list[str],
    examples: list[Example] | None,
    *,
    k: int,
    progress: bool,
    ablate: int = ABLATE_NODES,
    **run: Any,
) -> list[UnitCard]:
    """The path cards, then the node cards (see the module docstring); describe's builder for
    kinds ``"edge"`` and ``"node"``."""
    paths: list[CircuitPath] = list(plan.keys) if plan.kind == "edge" else []
    nodes = list(dict.fromkeys(n for p in paths for n in p.nodes[1:-1])) if paths else list(plan.keys)
    inner = _inner_cards(model, plan, nodes, corpus, examples, ablate=ablate, k=k, progress=progress, **run)
    index = {name: len(paths) + i for i, name in enumerate(nodes)}
    cards = []
    for rank, p in enumerate(paths, 1):
        details = {**p.to_dict(), "rank": rank, "definition": SCORE_DEFINITION}
        details["node_cards"] = {n: index[n] for n in p.nodes if n in index}
        score = p.score if plan.scores is not None else None  # an edge set without scores: all paths tie
        cards.append(UnitCard(rank, "path", score=score, details=details))
    for name in nodes:
        through = [i for i, p in enumerate(paths) if name in p.nodes]
        cards.append(_node_card(name, inner.get(name), plan, through))
    return cards


def _node_link(name: str, where: dict[str, int]) -> str:
    from capinterp.cards.page import _e

    if name in where:
        return f'<a class="t" href="#card-{int(where[name])}">{_e(name)}</a>'
    return f'<span class="t">{_e(name)}</span>'


def _edge_rows(title: str, rows: list[dict[str, Any]], key: str) -> str:
    from capinterp.cards.page import _e, _num

    if not rows:
        return ""
    body = "".join(f"<tr><td>{_e(str(r[key]))}</td><td>{_num(r['score'])}</td></tr>" for r in rows)
    return f'<div><div class="label">{_e(title)}</div><table class="stats">{body}</table></div>'


def circuit_section(card: Any) -> str:
    """A path card's chain of nodes (each linked to its card) with each step's slot and edge score;
    a node card's paths, its strongest edges in and out, and its layer / head card's own sections."""
    from capinterp.cards.page import DETAIL_SECTIONS, _e, _num

    d = card.details
    if card.kind == "path":
        parts = [_node_link(d["nodes"][0], d["node_cards"])]
        for step in d["steps"]:
            via = "" if step["slot"] == step["target"] else f"{_e(step['slot'])} "  # a head's q / k / v slot
            parts.append(f" <small>&rarr; {via}({_num(step['score'])}) &rarr;</small> ")
            parts.append(_node_link(step["target"], d["node_cards"]))
        return f'<div class="label">path</div><div class="toks">{"".join(parts)}</div><div class="meta">{_e(d["definition"])}</div>'
    links = " ".join(f'<a href="#card-{int(i)}">path {int(r)}</a>' for r, i in zip(d["paths"], d["path_cards"]))
    parts = [f'<div class="label">{_e(d["node_kind"])} node {_e(d["node"])}</div>']
    if d.get("described_as"):
        parts.append(f'<div class="meta">described as {_e(d["described_as"]["label"])}</div>')
    if d.get("note"):
        parts.append(f'<div class="meta">{_e(d["note"])}</div>')
    parts.append(f'<div class="row">on {links or "no listed path"}</div>')
    edges = _edge_rows("strongest edges in (source)", d["edges_in"], "source")
    edges += _edge_rows("strongest edges out (slot)", d["edges_out"], "slot")
    parts.append(f'<div class="row">{edges}</div>')
    inner_kind = (d.get("described_as") or {}).get("kind")
    if inner_kind in DETAIL_SECTIONS and d.get("inner"):
        from capinterp.cards.page import details_html

        parts.append(details_html(dataclasses.replace(card, kind=inner_kind, details=d["inner"])))
    return "".join(parts)
