"""Faithfulness over circuit edges: every point of the curve against a hand-written patched forward."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from edge_hooks import slot_hook, source_hook

import capinterp as ci
from capinterp.circuits import Circuit, EdgeSet, Graph, graph_mode, make_pairs
from capinterp.core.tokens import encode
from capinterp.data import Example
from capinterp.interventions.faithfulness import faithfulness
from capinterp.localizers.knowledge_circuit import KnowledgeCircuit

FACTS = [
    Example("Rome is the capital of", " Italy", {"subject": "Rome"}),
    Example("Berlin is the capital of", " Germany", {"subject": "Berlin"}),
    Example("The Eiffel Tower is in the city of", " Paris", {"subject": "The Eiffel Tower"}),
]


@pytest.fixture(scope="module")
def tiny():
    return ci.load_model("tiny", threads=1)


SWAPS = [  # subject swaps of equal token width exist among these on the tiny model's tokenizer
    Example("Rome is the capital of", " Italy", {"subject": "Rome"}),
    Example("Berlin is the capital of", " Germany", {"subject": "Berlin"}),
    Example("Madrid is the capital of", " Spain", {"subject": "Madrid"}),
    Example("London is the capital of", " England", {"subject": "London"}),
]


@torch.no_grad()
def _reference(model, graph: Graph, kept: set, ablation: str, facts: list = FACTS) -> float:
    """Mean p(first target token) with every edge outside ``kept`` ablated, one example at a time:
    plain hooks record each source's output as the pass computes it, and each slot input loses
    ``output - reference`` of every removed edge into it (reference: 0, or the source's mean
    output over the facts' first tokens at position 0 and over all their later tokens after it, in a
    clean run, or its output at the same position on the example's subject-swapped prompt)."""
    items = encode(model, facts)
    srcs = {s: source_hook(s) for s in graph.sources}
    with graph_mode(model, graph):  # only switches on the per-head / per-input hooks

        def outputs(cache, s):
            name, idx = srcs[s]
            return cache[name][0] if idx is None else cache[name][0, :, idx]

        ref = {s: torch.zeros(int(model.cfg.d_model)) for s in graph.sources}
        if ablation == "mean":
            caches = [model.run_with_cache(torch.tensor([it.ids]))[1] for it in items]
            ref = {
                s: torch.stack(
                    [
                        torch.stack([outputs(c, s)[0] for c in caches]).mean(0),
                        torch.cat([outputs(c, s)[1:] for c in caches]).mean(0),
                    ]
                )
                for s in graph.sources
            }
        else:
            ref = {s: r[None].expand(2, -1) for s, r in ref.items()}
        per_item = [ref] * len(items)
        if ablation == "corrupt":
            pairs = make_pairs(model, facts)
            assert all(p.mode == "swap" for p in pairs)
            caches = [model.run_with_cache(torch.tensor([p.corrupt_ids]))[1] for p in pairs]
            per_item = [{s: outputs(c, s) for s in graph.sources} for c in caches]
        removed: dict[str, list[str]] = {}
        for src, slot in graph.edges():
            if (src, slot) not in kept:
                removed.setdefault(slot, []).append(src)
        probs = []
        for it, ref in zip(items, per_item):
            live: dict[str, torch.Tensor] = {}

            def record(s):
                def fn(x, hook):
                    live[s] = x[0] if srcs[s][1] is None else x[0, :, srcs[s][1]]

                return fn

            def cut(slot, ref=ref):
                name, idx = slot_hook(slot)

                def fn(x, hook):
                    x = x.clone()
                    T = x.shape[1]
                    at = slice(None) if ablation == "corrupt" else [0] + [1] * (T - 1)  # [2, d] -> [T, d]
                    delta = sum(live[s] - ref[s][at] for s in removed.get(slot, []))
                    if idx is None:
                        x[0] -= delta
                    else:
                        x[0, :, idx] -= delta
                    return x

                return name, fn

            hooks = [(srcs[s][0], record(s)) for s in graph.sources]
            hooks += [cut(slot) for slot in graph.slots]
            logits = model.run_with_hooks(torch.tensor([it.ids]), fwd_hooks=hooks)
            probs.append(float(logits[0, it.last_prompt_pos].softmax(-1)[it.target_ids[0]]))
    return float(np.mean(probs))


@pytest.mark.parametrize("ablation,by", [("zero", "score"), ("mean", "auto")])
def test_every_point_equals_a_hand_written_patched_forward(tiny, ablation, by):
    g = Graph.from_model(tiny)
    scores = torch.randn(g.n_src, g.n_slots, generator=torch.Generator().manual_seed(1)) * g.edge_mask
    res = faithfulness(tiny, scores, FACTS, ks=[1, 40, g.n_edges], ablation=ablation, by=by, random_sets=1)
    assert res.meta["unit"] == "edge" and res.meta["n_units"] == g.n_edges == 343
    edges = g.edges()
    flat = torch.tensor([float(scores[g.sources.index(a), g.slots.index(b)]) for a, b in edges])
    order = torch.sort(flat if by == "score" else flat.abs(), descending=True, stable=True).indices.tolist()
    full, empty = _reference(tiny, g, set(edges), ablation), _reference(tiny, g, set(), ablation)
    assert res.full == pytest.approx(full, rel=1e-4)
    assert res.empty == pytest.approx(empty, rel=1e-3, abs=1e-6)
    assert abs(res.full - res.empty) > 1e-4
    for k, kept, ablated in zip(res.table["k"], res.table["kept"], res.table["ablated"]):
        top = {edges[i] for i in order[:k]}
        assert kept == pytest.approx(_reference(tiny, g, top, ablation), rel=1e-3, abs=1e-6)
        assert ablated == pytest.approx(_reference(tiny, g, set(edges) - top, ablation), rel=1e-3, abs=1e-6)
    last = res.table.iloc[-1]  # every edge kept: the full model; every edge ablated: the empty one
    assert last["kept"] == pytest.approx(res.full, rel=1e-5) and last["ablated"] == pytest.approx(res.empty, rel=1e-4)
    assert np.allclose(res.table["faithfulness"], (res.table["kept"] - res.empty) / (res.full - res.empty))


def test_corrupt_ablation_against_the_hand_written_forward(tiny):
    """Corrupt: every edge ablated is the subject-swapped run; every point as the reference."""
    g = Graph.from_model(tiny)
    scores = torch.randn(g.n_src, g.n_slots, generator=torch.Generator().manual_seed(2)) * g.edge_mask
    res = faithfulness(tiny, scores, SWAPS, ks=[30], ablation="corrupt", random_sets=0)
    edges = g.edges()
    flat = torch.tensor([float(scores[g.sources.index(a), g.slots.index(b)]) for a, b in edges])
    top = {edges[i] for i in torch.sort(flat.abs(), descending=True, stable=True).indices[:30].tolist()}
    assert res.table["kept"].iloc[0] == pytest.approx(_reference(tiny, g, top, "corrupt", SWAPS), rel=1e-3, abs=1e-6)
    assert res.table["ablated"].iloc[0] == pytest.approx(
        _reference(tiny, g, set(edges) - top, "corrupt", SWAPS), rel=1e-3, abs=1e-6
    )
    probs = []  # nothing kept: the corrupted prompts' own p(clean target)
    for it, p in zip(encode(tiny, SWAPS), make_pairs(tiny, SWAPS)):
        with torch.no_grad():
            logits = tiny(torch.tensor([p.corrupt_ids]))
        probs.append(float(logits[0, it.last_prompt_pos].softmax(-1)[it.target_ids[0]]))
    assert res.empty == pytest.approx(float(np.mean(probs)), rel=1e-3)
    assert abs(res.full - res.empty) > 1e-5


def test_full_model_equals_the_plain_forward(tiny):
    g = Graph.from_model(tiny)
    res = faithfulness(tiny, Circuit.full(g), FACTS, ablation="zero", random_sets=0)
    probs = []
    for it in encode(tiny, FACTS):
        with torch.no_grad():
            logits = tiny(torch.tensor([it.ids]))
        probs.append(float(logits[0, it.last_prompt_pos].softmax(-1)[it.target_ids[0]]))
    assert res.full == pytest.approx(float(np.mean(probs)), rel=1e-5)
    assert res.table["k"].tolist() == [g.n_edges]  # a set without scores: its own size


def test_knowledge_circuit_circuit_and_edge_set_inputs(tiny):
    kc = KnowledgeCircuit(tiny, algorithm="eap", top_n=20, progress=False).fit(FACTS)
    a = faithfulness(tiny, kc, FACTS, ks=[5, 20], by="abs", random_sets=2)
    b = faithfulness(tiny, kc.circuit_, FACTS, ks=[5, 20], by="abs", random_sets=2)
    c = faithfulness(tiny, kc.scores_, FACTS, ks=[5, 20], by="abs", random_sets=2)
    assert a.cpr == b.cpr == c.cpr and a.table["kept"].tolist() == c.table["kept"].tolist()
    s = faithfulness(tiny, kc.units_, FACTS, random_sets=2)
    assert s.table["k"].tolist() == [len(kc.units_)]
    # the EdgeSet's kept value is the circuit's own edges kept, whatever their order
    circ = faithfulness(tiny, Circuit(kc.graph_, kc.circuit_.mask), FACTS, random_sets=0)
    assert s.table["kept"].iloc[0] == pytest.approx(circ.table["kept"].iloc[0], rel=1e-6)


def test_bad_edge_input_is_refused(tiny):
    g = Graph.from_model(tiny)
    with pytest.raises(ValueError, match="n_src, n_slots"):
        faithfulness(tiny, torch.zeros(3, 4), FACTS)
    with pytest.raises(ValueError, match="not fitted"):
        faithfulness(tiny, KnowledgeCircuit(tiny, progress=False), FACTS)
    with pytest.raises(ValueError, match="not this model's graph"):
        faithfulness(tiny, Circuit.full(Graph(g.n_layers + 1, g.n_heads, g.n_kv_heads, "qkv")), FACTS)
    with pytest.raises(ValueError, match="only"):
        faithfulness(tiny, Circuit.empty(g).units(), FACTS, ks=[3])


def test_planted_path_is_faithful_far_above_chance():
    """A 2-layer model whose dominant path is input -> a0.h1 -> m1 -> logits (other heads and m0
    scaled down): the path's 8 edges keep far more than 8 random edges."""
    m = ci.load_model("tiny", n_layers=2, threads=1)
    dh, H = m.cfg.d_head, m.cfg.n_heads
    with torch.no_grad():
        for l in range(2):
            w_o = m.blocks[l].attn.o.original_component.weight  # [d_model, H * d_head]
            for h in range(H):
                w_o[:, h * dh : (h + 1) * dh] *= 3.0 if (l, h) == (0, 1) else 0.03
            m.blocks[l].mlp.out.original_component.weight.mul_(3.0 if l == 1 else 0.03)
    g = Graph.from_model(m)
    grp = f"a0.g{1 // (g.n_heads // g.n_kv_heads)}"
    path = [("input", "a0.h1<q"), ("input", f"{grp}<k"), ("input", f"{grp}<v"), ("input", "m1")]
    path += [("a0.h1", "m1"), ("m1", "logits"), ("a0.h1", "logits"), ("input", "logits")]
    res = faithfulness(m, EdgeSet(path, g), FACTS, ablation="mean", random_sets=10)
    row = res.table.iloc[0]
    assert row["k"] == 8
    assert row["faithfulness"] > 0.9 and row["faithfulness"] > row["random_faithfulness_p95"] + 0.5
    assert abs(row["ablated_faithfulness"]) < 0.1  # ablating the 8 path edges is ablating everything
