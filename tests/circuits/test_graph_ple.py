"""The circuit graph with per-layer-embedding nodes (Gemma 4's PLE, ``Graph.ple``): names, upstream sets
and serialization against the computation order written out by hand."""

from __future__ import annotations

import pytest

from capinterp.circuits.graph import LOGITS, Graph


def _expected_upstream(g: Graph) -> dict[str, int]:
    """Slot -> how many sources are written before it reads, walking a sequential layer by hand: the heads
    read their slots and write, the MLP reads and writes, then the per-layer embedding reads and writes."""
    written, out = 1, {}  # the input node
    for l in range(g.n_layers):
        for name in g.attn_slots(l):
            out[name] = written
        written += g.n_heads
        out[f"m{l}"] = written
        written += 1
        out[f"p{l}"] = written
        written += 1
    out[LOGITS] = written
    return out


@pytest.mark.parametrize("granularity", ["qkv", "head", "layer"])
def test_upstream_sets_follow_the_computation_order(granularity):
    g = Graph(3, 4, 2, granularity, ple=True)
    assert g.sources[: 1 + 4 + 2] == ("input", "a0.h0", "a0.h1", "a0.h2", "a0.h3", "m0", "p0")
    want = _expected_upstream(g)
    assert [g.n_upstream(j) for j in range(g.n_slots)] == [want[s] for s in g.slots]
    for l in range(3):
        assert g.sources[g.mlp_src(l)] == f"m{l}" and g.sources[g.ple_src(l)] == f"p{l}"
        assert g.slots[g.slot_index(l, "mlp").start] == f"m{l}" and g.slots[g.slot_index(l, "ple").start] == f"p{l}"
        assert g.slot_nodes(g.slot_index(l, "ple").start) == (f"p{l}",)
    assert g.n_edges == int(g.edge_mask.sum())
    assert g.slots_per_layer == len(g.attn_slots(0)) + 2


def test_serialization_and_signature_keep_the_per_layer_embeddings():
    g = Graph(2, 2, 2, "qkv", ple=True)
    assert Graph.from_dict(g.to_dict()) == g and g.to_dict()["ple"] is True
    assert g.signature[-1] == "ple" and g.signature != Graph(2, 2, 2, "qkv").signature
    assert "ple" not in Graph(2, 2, 2, "qkv").to_dict()  # other graphs' files are unchanged
    with pytest.raises(ValueError, match="parallel"):
        Graph(2, 2, 2, "qkv", parallel=True, ple=True)
    with pytest.raises(ValueError, match="no per-layer-embedding"):
        Graph(2, 2, 2, "qkv").ple_src(0)
