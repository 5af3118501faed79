"""Circuit cards: the strongest paths equal a brute-force enumeration of every input-to-logits path
(hand-made DAGs, a hand-made circuit graph, a knowledge circuit of the tiny model), describe() on a
fitted KnowledgeCircuit (path cards, then deduplicated node cards they link to), the other circuit
inputs, and bad input refused before any forward pass."""

from __future__ import annotations

import json
import math
import random
import re

import pytest
import torch

import capinterp as ci
from capinterp.cards import describe
from capinterp.cards.circuit_paths import best_paths, strongest_paths
from capinterp.circuits import Circuit, Graph
from capinterp.core.example import Example
from capinterp.localizers.knowledge_circuit import KnowledgeCircuit

FACTS = [
    Example("Rome is the capital of", " Italy", {"subject": "Rome"}),
    Example("Berlin is the capital of", " Germany", {"subject": "Berlin"}),
]
TEXTS = ["The cat sat on the mat.", "Rome is in Italy.", "<b>bold</b> & 'quotes'"]


@pytest.fixture(scope="module")
def kc(tiny):
    return KnowledgeCircuit(tiny, algorithm="eap", top_n=30, progress=False).fit(FACTS)


def _brute_arcs(arcs, source, sink):
    """Every source -> sink path (as arc indices) by depth-first enumeration, with its smallest weight."""
    found = []

    def walk(u, steps):
        if u == sink:
            found.append((min(arcs[a][2] for a in steps), tuple(steps)))
            return
        for a, (x, _, _) in enumerate(arcs):
            if x == u:
                walk(arcs[a][1], [*steps, a])

    walk(source, [])
    return sorted(found, key=lambda f: (-f[0], f[1]))


def _random_dag(rng, n_nodes, n_arcs):
    arcs = []
    for _ in range(n_arcs):
        u, v = sorted(rng.sample(range(n_nodes), 2))
        arcs.append((u, v, rng.choice([0.0, 0.25, 0.5, 0.5, 1.0, 2.0])))  # repeated weights: ties
    return arcs


@pytest.mark.parametrize("seed", range(12))
def test_best_paths_equal_brute_force_on_random_dags(seed):
    rng = random.Random(seed)
    arcs = _random_dag(rng, n_nodes=7, n_arcs=16)  # parallel arcs come up too
    want = _brute_arcs(arcs, 0, 6)
    if not want:
        with pytest.raises(ValueError, match="no path"):
            best_paths(arcs, 0, 6, 3)
        return
    for n in (1, 3, len(want), len(want) + 5):
        got = best_paths(arcs, 0, 6, n)
        assert got == want[:n]


def test_best_paths_refuse_cycles_and_bad_weights():
    with pytest.raises(ValueError, match="cycle"):
        best_paths([("s", "a", 1.0), ("a", "b", 1.0), ("b", "a", 1.0), ("b", "t", 1.0)], "s", "t", 2)
    for w in (-1.0, math.nan, math.inf):
        with pytest.raises(ValueError, match="finite and >= 0"):
            best_paths([("s", "t", w)], "s", "t", 1)
    with pytest.raises(ValueError, match="n must be"):
        best_paths([("s", "t", 1.0)], "s", "t", 0)


def _brute_circuit(circuit):
    """Every input -> logits path of a circuit from the graph's own definitions: (score, nodes, slots)."""
    g, m, s = circuit.graph, circuit.mask, circuit.scores
    node_at = {n: i for i, n in enumerate(g.nodes)}
    src_at = {n: i for i, n in enumerate(g.sources)}
    found = []

    def walk(node, steps):
        if node == "logits":
            found.append(steps)
            return
        i = src_at[node]
        for j in range(g.n_slots):
            if m[i, j]:
                for reader in g.slot_nodes(j):
                    walk(reader, [*steps, (i, j, node_at[reader])])

    walk("input", [])
    out = []
    for steps in found:
        score = min(abs(float(s[i, j])) for i, j, _ in steps) if s is not None else 1.0
        nodes = ("input", *(g.nodes[r] for _, _, r in steps))
        out.append((score, steps, nodes, tuple(g.slots[j] for _, j, _ in steps)))
    out.sort(key=lambda f: (-f[0], f[1]))
    return [(score, nodes, slots) for score, _, nodes, slots in out]


def _as_rows(paths):
    return [(p.score, p.nodes, p.slots) for p in paths]


@pytest.mark.parametrize("seed", range(4))
def test_strongest_paths_equal_brute_force_on_a_hand_made_graph(seed):
    g = Graph(n_layers=2, n_heads=2, n_kv_heads=1)  # grouped k/v slots: one edge, two readers
    gen = torch.Generator().manual_seed(seed)
    mask = (torch.rand(g.n_src, g.n_slots, generator=gen) < 0.5) & g.edge_mask
    scores = torch.randint(-3, 4, (g.n_src, g.n_slots), generator=gen).float() / 2  # ties and zeros
    circuit = Circuit(g, mask, scores)
    want = _brute_circuit(circuit)
    assert want, "the random circuit has no path: pick another seed"
    assert _as_rows(strongest_paths(circuit, len(want) + 3)) == want
    assert _as_rows(strongest_paths(circuit, 2)) == want[:2]


def test_strongest_paths_of_a_knowledge_circuit_equal_brute_force(kc):
    want = _brute_circuit(kc.circuit_)
    paths = strongest_paths(kc.circuit_, len(want))
    assert len(want) > 3 and _as_rows(paths) == want
    p = paths[0]
    signed = [float(kc.circuit_.scores[kc.graph_.sources.index(a), kc.graph_.slots.index(b)]) for a, b in p.edges]
    assert list(p.edge_scores) == pytest.approx(signed) and p.score == pytest.approx(min(map(abs, signed)))
    assert all(edge in kc.circuit_ for edge in p.edges)


def test_describe_a_fitted_knowledge_circuit(tiny, kc, tmp_path):
    cards = describe(tiny, kc, TEXTS, task=FACTS, top=3, k=2, progress=False)
    paths = strongest_paths(kc.circuit_, 3)
    assert [c.kind for c in cards[:3]] == ["path"] * 3 and [c.unit for c in cards[:3]] == [1, 2, 3]
    assert [c.score for c in cards[:3]] == pytest.approx([p.score for p in paths])
    nodes = list(dict.fromkeys(n for p in paths for n in p.nodes[1:-1]))
    assert [c.unit for c in cards[3:]] == nodes and all(c.kind == "node" for c in cards[3:])
    for card in cards[:3]:
        assert card.details["nodes"] == list(paths[card.unit - 1].nodes)
        for name, i in card.details["node_cards"].items():
            assert cards[i].unit == name and card.unit in cards[i].details["paths"]
    mlp = [c for c in cards[3:] if c.details["node_kind"] == "mlp"]
    assert mlp, "the strongest paths should cross an MLP"
    layer = describe(tiny, ci.KeySet.layers([int(mlp[0].unit[1:])], n_layers=4), TEXTS, k=2, ablate=0, progress=False)
    assert [c.activation for c in mlp[0].contexts] == pytest.approx([c.activation for c in layer[0].contexts])
    assert mlp[0].ablation is not None and cards[0].ablation is None
    assert cards.meta["unit_kind"] == "edge" and cards.meta["units_in_input"] == len(kc.circuit_)
    page = cards.save(tmp_path / "cards.html").read_text(encoding="utf-8")
    for i in range(len(cards)):
        assert f'id="card-{i}"' in page
    targets = {int(t) for t in re.findall(r'href="#card-(\d+)"', page)}
    assert set(range(3, len(cards))) <= targets  # every node card is linked from a path card
    json.loads(cards.save(tmp_path / "cards.json").read_text(encoding="utf-8"))


def test_head_nodes_without_head_cards_keep_their_edges(tiny, kc, monkeypatch):
    import importlib

    d = importlib.import_module("capinterp.cards.describe")
    monkeypatch.setattr(d, "BUILDERS", {k: v for k, v in d.BUILDERS.items() if k != "head"})
    cards = describe(tiny, kc.circuit_, TEXTS, top=2, k=2, ablate=0, progress=False)
    heads = [c for c in cards if c.kind == "node" and c.details["node_kind"] == "head"]
    assert heads and all(not c.contexts and c.details["note"] for c in heads)
    for c in heads:
        ins = [(e["source"], e["slot"]) for e in c.details["edges_in"]]
        assert ins and all(edge in kc.circuit_ for edge in ins)
        assert all(c.unit in kc.graph_.slot_nodes(kc.graph_.slots.index(slot)) for _, slot in ins)


def test_edge_and_node_sets(tiny, kc):
    edges = describe(tiny, kc.units_, TEXTS, top=2, k=2, progress=False)  # an EdgeSet: no scores
    paths = [c for c in edges if c.kind == "path"]
    assert len(paths) == 2 and all(c.score is None and c.details["score"] == 1.0 for c in paths)
    nodes = ci.KeySet(["m2", "a1.h0", "input"], "node")
    cards = describe(tiny, nodes, TEXTS, top=5, k=2, progress=False)
    assert [c.unit for c in cards] == ["a1.h0", "m2"] and all(c.kind == "node" for c in cards)
    assert cards[1].contexts and cards[1].details["paths"] == []


def _dead_circuit(g):
    mask = torch.zeros(g.n_src, g.n_slots, dtype=torch.bool)
    mask[g.sources.index("input"), g.slots.index("m0")] = True  # m0 is read by nobody kept
    return Circuit(g, mask, torch.ones(g.n_src, g.n_slots))


def test_bad_circuits_are_refused_before_any_forward(tiny):
    from capinterp.testing import ForwardCounter

    g = Graph.from_model(tiny)
    small = Graph(n_layers=2, n_heads=2, n_kv_heads=1)
    with ForwardCounter(tiny) as passes:
        with pytest.raises(ValueError, match="no edges"):
            describe(tiny, Circuit.empty(g), TEXTS, progress=False)
        with pytest.raises(ValueError, match="none of the circuit's 1 edges"):
            describe(tiny, _dead_circuit(g), TEXTS, progress=False)
        with pytest.raises(ValueError, match="not this model's graph"):
            describe(tiny, Circuit.full(small), TEXTS, progress=False)
        with pytest.raises(ValueError, match="no nodes of this model"):
            describe(tiny, ci.KeySet(["m9"], "node"), TEXTS, progress=False)
        with pytest.raises(ValueError, match="not fitted"):
            describe(tiny, KnowledgeCircuit(tiny, progress=False), TEXTS, progress=False)
    assert passes.n == 0


def test_the_describe_command_reads_a_saved_circuit(kc, tmp_path, capsys):
    from capinterp.app.cli import main
    from capinterp.app.describe_cmd import load_result

    path = kc.circuit_.save(tmp_path / "circuit.json")
    loaded = load_result(str(path))
    assert isinstance(loaded, Circuit) and len(loaded) == len(kc.circuit_)
    assert _as_rows(strongest_paths(loaded, 4)) == _as_rows(strongest_paths(kc.circuit_, 4))
    (tmp_path / "t.txt").write_text("\n\n".join(TEXTS))
    argv = ["describe", "--model", "tiny", "--result", str(path), "--texts", str(tmp_path / "t.txt")]
    assert main([*argv, "--top", "2", "--k", "1", "--out", str(tmp_path / "o")]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["unit_kind"] == "edge" and res["units"][:2] == ["path 1", "path 2"]
    assert all(u.startswith("node ") for u in res["units"][2:]) and (tmp_path / "o" / "cards.html").is_file()
    ci.KeySet([("input", "m0")], "edge").save(tmp_path / "hand_made.json")  # names no graph
    with pytest.raises(ValueError, match="edge units name no circuit graph"):
        load_result(str(tmp_path / "hand_made.json"))
    kc.units_.save(tmp_path / "edges.json")  # an EdgeSet saved as a KeySet keeps its graph in its space
    assert len(describe(kc.model, load_result(str(tmp_path / "edges.json")), TEXTS, top=1, progress=False)) > 1
