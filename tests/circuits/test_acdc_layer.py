"""ACDC's layer route (trials from the tried slot's layer up) against the full route (one whole forward per trial)."""

from __future__ import annotations

import warnings

import pytest
import torch

from capinterp.arch.model import load_model
from capinterp.circuits import Graph, acdc
from capinterp.circuits.acdc_layer import layer_route, slot_layer
from capinterp.core.example import Example

# multi-token targets: several answer positions per fact, in padded batches of two
FACTS = [
    Example("Rome is the capital of", " Italy and Rome"),
    Example("Berlin is the capital of", " Germany"),
    Example("The Eiffel Tower is in the city of", " Paris, France"),
]


@pytest.fixture(scope="module")
def small():
    m = load_model("tiny", n_layers=2, threads=1)
    return m, Graph.from_model(m)


def _both(m, g, **kw):
    with warnings.catch_warnings():  # candidates that do not carry the behaviour warn; not the point here
        warnings.simplefilter("ignore", RuntimeWarning)
        return {r: acdc(m, g, FACTS, route=r, batch_size=2, **kw) for r in ("full", "layer")}


def _same(res) -> None:
    (kf, df, inf), (kl, dl, inl) = res["full"], res["layer"]
    assert inf["route"] == "full" and inl["route"] == "layer"
    assert torch.equal(kf, kl)  # the same decisions, edge for edge
    assert 0 < int(kl.sum()) < inl["n_visited"]  # some visited edges kept, some removed: decisions exercised
    # float32: the layer route unembeds only the answer positions, a matmul of fewer rows (a few ulps of
    # the logits); the residual streams are bit-identical
    assert torch.allclose(df, dl, rtol=0, atol=5e-6)
    assert inl["match_nll"] == pytest.approx(inf["match_nll"], abs=5e-6)
    assert inl["match_nll_start"] == pytest.approx(inf["match_nll_start"], abs=5e-6)
    assert inl["n_visited"] == inf["n_visited"]


def test_layer_route_equals_full_route(small):
    m, g = small
    assert layer_route(m, g)
    res = _both(m, g, threshold=0.01)
    assert res["full"][2]["n_visited"] == g.n_edges
    _same(res)


def test_layer_route_equals_full_route_with_candidates(small):
    """Candidates leave removals below every visited slot's layer: the recorded start must carry them."""
    m, g = small
    gen = torch.Generator().manual_seed(0)
    cand = g.edge_mask & (torch.rand(g.n_src, g.n_slots, generator=gen) < 0.6)
    res = _both(m, g, threshold=0.01, candidates=cand)
    assert res["full"][2]["match_nll_start"] > 0.01  # the edges outside the candidates do matter
    _same(res)


def test_layer_route_skips_the_blocks_below(small):
    m, g = small
    calls = [0] * len(m.blocks)
    handles = [
        blk.register_forward_pre_hook(lambda *_, j=j: calls.__setitem__(j, calls[j] + 1))
        for j, blk in enumerate(m.blocks)
    ]
    try:
        counts = {}
        for r in ("full", "layer"):
            calls[:] = [0] * len(m.blocks)
            _, _, info = acdc(m, g, FACTS, threshold=0.01, route=r, batch_size=8)
            counts[r] = list(calls)
    finally:
        for h in handles:
            h.remove()
    n_top = int(sum(slot_layer(g, j) == 1 for i in range(g.n_src) for j in range(g.n_slots) if g.edge_mask[i, j]))
    n_logits = int(g.edge_mask[:, -1].sum())
    assert counts["full"][0] == info["n_visited"] + 2
    # block 0 runs for the two full passes, the recorded start and its check, and the trials of layer 0 only
    assert counts["layer"][0] == counts["full"][0] - n_top - n_logits + 1
    assert counts["layer"][1] == counts["full"][1] - n_logits + 1


def test_route_is_checked(small):
    m, g = small
    with pytest.raises(ValueError, match="route must be"):
        acdc(m, g, FACTS, route="fast")
