"""Circuit graphs of other families: parallel blocks, one attention slot per layer, and the
family checks (capinterp.testing.family_checks.circuits) failing when the graph is wrong."""

from __future__ import annotations

import pytest

from capinterp.circuits import Circuit, Graph


def test_parallel_graph_has_no_edge_from_heads_into_their_own_mlp():
    seq, par = Graph(2, 4, 4), Graph(2, 4, 4, parallel=True)
    assert par.mask_of([("input", "m0"), ("a0.h3", "m1"), ("m0", "a1.h0<q")]).sum() == 3
    with pytest.raises(KeyError, match="not an edge"):
        par.mask_of([("a0.h0", "m0")])
    seq.mask_of([("a0.h0", "m0")])  # a sequential block's MLP reads its layer's heads
    assert seq.n_edges - par.n_edges == 2 * 4  # H edges per layer
    assert Graph.from_dict(par.to_dict()) == par and par.signature != seq.signature
    assert Graph.from_dict({k: v for k, v in seq.to_dict().items() if k != "parallel"}) == seq  # old files


def test_layer_granularity_one_attention_slot_per_layer():
    g = Graph(2, 4, 2, "layer", parallel=True)
    assert g.attn_slots(1) == ["a1"] and g.slots == ("a0", "m0", "a1", "m1", "logits")
    assert g.slot_nodes(2) == ("a1.h0", "a1.h1", "a1.h2", "a1.h3")
    assert g.slot_index(1, "layer") == slice(2, 3) and g.n_upstream(3) == g.head_src(1)
    c = Circuit(g, g.mask_of([("input", "a0"), ("a0.h2", "a1"), ("a1.h0", "logits")]))
    assert Circuit.from_dict(c.to_dict()).edges.keys() == c.edges.keys()
    assert {"a0.h2", "a1.h0"} <= set(c.nodes)


def test_eap_family_check_fails_on_a_sequential_graph_of_a_parallel_family(monkeypatch):
    """The reference is independent: a graph with the attention -> own-MLP edges is caught."""
    from capinterp.testing.family_checks import circuits

    real = Graph.from_model.__func__  # type: ignore[attr-defined]

    def sequential(cls, model, granularity="auto"):
        g = real(cls, model, granularity)
        return Graph(g.n_layers, g.n_heads, g.n_kv_heads, g.granularity, parallel=False)

    circuits.check_eap("gpt_neox")  # passes as built
    monkeypatch.setattr(Graph, "from_model", classmethod(sequential))
    with pytest.raises(AssertionError, match="gpt_neox"):
        circuits.check_eap("gpt_neox")


def test_head_outputs_from_the_output_projection_carry_the_residual_multiplier(monkeypatch):
    """Granite's bridge gives hook_result; forcing the by-hand route (z @ W_O slice, scaled by the
    family record's residual_multiplier) must agree with the transformers reference too, and must
    not without the multiplier."""
    import dataclasses

    from capinterp.arch.family import family_of
    from capinterp.circuits import forward, probe
    from capinterp.testing.family_checks import circuits
    from capinterp.testing.family_checks._models import load_pair

    real = probe.routes

    def by_hand(model, parallel):
        return dataclasses.replace(real(model, parallel), result="z")

    monkeypatch.setattr(forward, "routes", by_hand)
    circuits.check_eap("granite")
    model = load_pair("granite")[2]
    fam = family_of(model)
    assert fam.residual_multiplier == 0.5
    monkeypatch.setattr(model, "capinterp_family", dataclasses.replace(fam, residual_multiplier=1.0))
    with pytest.raises(AssertionError, match="granite"):
        circuits.check_eap("granite")
