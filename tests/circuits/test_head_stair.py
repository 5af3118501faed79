"""The stair route of exact head patching (clean run reused below each head's layer, logits at the
answer only) equals the full graph pass per head, for zero, mean and corrupted references."""

from __future__ import annotations

import numpy as np
import pytest

import capinterp as ci
from capinterp.circuits.graph import Graph
from capinterp.circuits.head_patching import head_effects
from capinterp.circuits.head_stair import MAX_ROWS, _groups, stair_route
from capinterp.data import Example
from capinterp.experiments.corrupt_partners import partner_pairs

EXAMPLES = [Example(f"{a}+{b}=", str(a + b)) for a, b in [(3, 4), (5, 2), (1, 6), (2, 5), (12, 3)]]


@pytest.fixture(scope="module")
def model():
    return ci.load_model("tiny")  # float32


@pytest.mark.parametrize("ablation", ["zero", "mean", "corrupt"])
def test_stair_equals_graph_route(model, ablation):
    assert stair_route(model, Graph.from_model(model))
    data = partner_pairs(model, EXAMPLES[:3]) if ablation == "corrupt" else EXAMPLES[2:]
    ref = head_effects(model, data, ablation=ablation, route="graph", batch_size=3)
    fast = head_effects(model, data, ablation=ablation, route="stair", batch_size=3)
    assert np.abs(ref).max() > 1e-4  # something to compare
    np.testing.assert_allclose(fast, ref, atol=1e-5, rtol=0)


def test_row_groups_cover_every_layer_once():
    layers = list(range(18))
    groups = _groups(layers, 4)
    assert [l for g in groups for l in g] == layers and all(len(g) * 4 <= MAX_ROWS for g in groups)
    assert _groups([0, 1], 64) == [[0], [1]]  # a layer wider than the limit still runs, alone


def test_unknown_route_is_refused(model):
    with pytest.raises(ValueError, match="route"):
        head_effects(model, EXAMPLES, route="fast")
