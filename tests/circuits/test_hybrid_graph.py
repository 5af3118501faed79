"""Circuit graphs of hybrid models: a layer's Mamba, linear-attention or convolution mixer is one node
``x{l}`` read through one slot; Falcon-H1's layers have heads and a mixer; NemotronH's FFN layers
neither. The matrix (tests/families/test_matrix.py) checks EAP, EAP-IG and ACDC on every hybrid row
against a hand-written gradient on plain transformers; these tests pin the graph itself and what a
user sees."""

from __future__ import annotations

import warnings

import pytest

import capinterp as ci
from capinterp.circuits import Circuit, Graph
from capinterp.circuits.forward import check_additive
from capinterp.testing.family_checks._models import load_pair

FACT = ci.Example("Rome is the capital of", " Italy", meta={"subject": "Rome"})


def test_mixer_layers_have_one_node_and_one_slot():
    g = Graph(3, 2, 1, "layer", kinds=("mixer", "both", "ffn"))
    assert g.sources == ("input", "x0", "m0", "a1.h0", "a1.h1", "x1", "m1", "m2")
    assert g.slots == ("x0", "m0", "a1", "x1", "m1", "m2", "logits")
    # x0 reads input; m0 reads input, x0; a1 and x1 read the layer's input (side by side); m1 also reads them
    assert [g.n_upstream(j) for j in range(g.n_slots)] == [1, 2, 3, 3, 6, 7, 8]
    assert g.n_edges == 1 + 2 + 3 + 3 + 6 + 7 + 8
    assert (g.mixer_src(1), g.mlp_src(1), g.head_src(1, 1), g.head_src(2, 2)) == (5, 6, 4, 7)
    assert g.slot_index(1, "mixer") == slice(3, 4) and g.slot_nodes(3) == ("x1",)
    with pytest.raises(KeyError, match="not an edge"):
        g.mask_of([("a1.h0", "x1")])  # side by side: the attention's output is not the mixer's input
    with pytest.raises(ValueError, match="layer 0 of this graph has no attention heads"):
        g.head_src(0)
    with pytest.raises(ValueError, match="layer 2 of this graph has no mixer"):
        g.slot_index(2, "mixer")
    with pytest.raises(ValueError, match="differ in their slots"):
        _ = g.slots_per_layer


def test_hybrid_graph_round_trips_and_differs_from_the_dense_one():
    g = Graph(2, 2, 2, "qkv", kinds=("mixer", "attn"))
    assert Graph.from_dict(g.to_dict()) == g and g.signature != Graph(2, 2, 2, "qkv").signature
    assert Graph(2, 2, 2, kinds=("attn", "attn")) == Graph(2, 2, 2)  # every layer attention: the dense graph
    c = Circuit(g, g.mask_of([("input", "x0"), ("x0", "a1.h1<q"), ("x0", "logits")]))
    back = Circuit.from_dict(c.to_dict())
    assert back.edges.keys() == c.edges.keys() and "x0" in back.nodes
    for bad in (dict(kinds=("mixer",)), dict(kinds=("mixer", "mamba")), dict(kinds=("mixer", "attn"), parallel=True)):
        with pytest.raises(ValueError):
            Graph(2, 2, 2, **bad)


@pytest.mark.parametrize("family", ["bamba", "falcon_h1", "nemotron_h"])
def test_knowledge_circuit_on_a_hybrid_model_keeps_mixer_nodes(family, tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = load_pair(family)[2]
        kc = ci.KnowledgeCircuit(model, algorithm="eap", top_n=12, progress=False).fit([FACT])
    g = kc.circuit_.graph
    mixers = [s for s in g.sources if s.startswith("x")]
    assert mixers and g.kinds, g
    scores = kc.circuit_.scores
    assert scores is not None and float(scores[[g.sources.index(x) for x in mixers]].abs().max()) > 0
    fig = kc.circuit_.plot(show_all_nodes=True)
    assert "mixer" in {t.name for t in fig.data}
    path = kc.circuit_.save(tmp_path / "c.json")
    assert Circuit.load(path).graph == g
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        table = ci.faithfulness(model, kc, [FACT], random_sets=2).table
    assert len(table) and table["fraction"].iloc[-1] == 1.0


def test_falcon_h1_refuses_per_head_inputs_and_a_graph_forward_that_changes_the_logits():
    """Falcon-H1's attention reads its norm's output times attention_in_multiplier; the bridge's split
    q/k/v inputs leave it out, so the graph's forward would not be the model's: refused both ways."""
    model = load_pair("falcon_h1")[2]
    with pytest.raises(ValueError, match="attention_in_multiplier=1.1.*granularity='layer'"):
        Graph.from_model(model, "qkv")
    auto = Graph.from_model(model)
    assert auto.granularity == "layer" and check_additive(model, auto) < 1e-5
    split = Graph(auto.n_layers, auto.n_heads, auto.n_kv_heads, "qkv", kinds=auto.kinds)
    with pytest.raises(NotImplementedError, match="changes this model's logits"):
        check_additive(model, split)


def test_the_eap_family_check_fails_when_the_mixer_node_is_wrong(monkeypatch):
    """The reference is independent: a mixer output off by 1 % is caught (and a correct one passes)."""
    from capinterp.circuits import forward
    from capinterp.testing.family_checks import circuits

    circuits.check_eap("lfm2")
    real = forward.run_graph

    def skewed(model, graph, tokens, **kw):
        run = real(model, graph, tokens, **kw)
        out = run.outputs.clone()
        out[:, :, graph.mixer_src(0)] *= 1.01
        return forward.GraphRun(run.logits, out, run.slot_inputs)

    monkeypatch.setattr("capinterp.circuits.eap.run_graph", skewed)
    with pytest.raises(AssertionError, match="EAP scores differ"):
        circuits.check_eap("lfm2")


@pytest.mark.parametrize("family", ["tiny", "bamba"])
def test_circuits_run_in_bfloat16_and_find_the_float32_edges(family):
    """In bfloat16 the decomposition holds to rounding (check_additive's 16-bit tolerance; it refused
    every bfloat16 model before, at 6e-3): EAP there keeps float32's top edges."""
    from capinterp.arch.tiny import tiny_hf

    facts = [FACT, ci.Example("The Eiffel Tower is in the city of", " Paris", meta={"subject": "The Eiffel Tower"})]
    scores = []
    for dtype in ("float32", "bfloat16"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if family == "tiny":
                model = ci.load_model("tiny", dtype=dtype)
            else:
                hf, tok = tiny_hf(family)
                model = ci.load_model(hf, tokenizer=tok, dtype=dtype)
            kc = ci.KnowledgeCircuit(model, algorithm="eap", top_n=20, progress=False).fit(facts)
        assert kc.circuit_.scores is not None
        scores.append(kc.circuit_.scores.flatten())
    full, low = scores
    top = [set(s.abs().topk(20).indices.tolist()) for s in scores]
    assert len(top[0] & top[1]) >= 18
    assert float((full - low).abs().max() / full.abs().max()) < 0.25


@pytest.mark.parametrize("family", ["olmo_hybrid", "granitemoehybrid", "falcon_h1", "nemotron_h", "gemma3_text"])
def test_node_params_count_every_block_parameter_once(family):
    """Post-norms (OLMo-Hybrid, Gemma 3) go with their sublayer, Granite 4.0's shared MLP with the MLP,
    Falcon-H1's shared ln1 with the mixer: the nodes' parameters add up to the blocks'."""
    from capinterp.circuits.forward import node_params

    model = load_pair(family)[2]
    g = Graph.from_model(model)
    counts = node_params(model, g)
    blocks = sum({id(p): p.numel() for b in model.blocks for p in b.parameters()}.values())
    assert sum(counts.values()) == blocks
    assert all(counts[n] > 0 for n in g.sources if n[0] in "ax")  # NemotronH's 0-wide MLPs own nothing


def test_a_graph_of_other_layers_is_refused_and_hybrid_files_carry_their_version(tmp_path):
    """A graph whose layer kinds are not the model's would read zeros for the mixers: refused before any
    pass; a hybrid circuit's file is format 2 (a dense one stays 1, as written before)."""
    from capinterp.circuits.forward import run_graph

    model = load_pair("bamba")[2]
    wrong = Graph(
        2, model.cfg.n_heads, model.cfg.n_key_value_heads or model.cfg.n_heads, "head", kinds=("mixer", "both")
    )
    with pytest.raises(ValueError, match="are not this model's"):
        run_graph(model, wrong, model.to_tokens("Rome"))
    g = Graph.from_model(model)
    assert Circuit.full(g).to_dict()["format_version"] == 2
    assert Circuit.full(Graph(2, 2, 2)).to_dict()["format_version"] == 1
