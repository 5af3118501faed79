"""Circuit edges in patching_agreement: exact single-edge effects against a hand-written patched
forward (plain hooks), EAP scores in graph.edges() order, and the rows the experiment adds."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from edge_hooks import slot_hook, source_hook

import capinterp as ci
from capinterp.circuits import Graph, graph_mode, make_pairs
from capinterp.circuits.eap import score_edges
from capinterp.core.tokens import encode
from capinterp.data import Example
from capinterp.experiments import edge_agreement as EA
from capinterp.experiments import patching_agreement as PA
from capinterp.experiments.agreement_stats import stat_row

SWAPS = [  # subject swaps of equal token width exist among these on the tiny model's tokenizer
    Example("Rome is the capital of", " Italy", {"subject": "Rome"}),
    Example("Berlin is the capital of", " Germany", {"subject": "Berlin"}),
    Example("Madrid is the capital of", " Spain", {"subject": "Madrid"}),
    Example("London is the capital of", " England", {"subject": "London"}),
]


@pytest.fixture(scope="module")
def tiny():
    return ci.load_model("tiny", threads=1)


@torch.no_grad()
def _hand_logit_diff(model, graph: Graph, edge: tuple[str, str] | None) -> float:
    """Mean logit[answer] - logit[corrupted answer], with ``edge``'s source output in its slot's input
    replaced by the source's output on the subject-swapped prompt (hooks on the plain model)."""
    items, pairs = encode(model, SWAPS), make_pairs(model, SWAPS)
    assert all(p.mode == "swap" for p in pairs)
    out = []
    with graph_mode(model, graph):
        for it, p in zip(items, pairs):
            hooks = []
            if edge is not None:
                (sname, sidx), (vname, vidx) = source_hook(edge[0]), slot_hook(edge[1])
                cache = model.run_with_cache(torch.tensor([p.corrupt_ids]))[1]
                ref = cache[sname][0] if sidx is None else cache[sname][0, :, sidx]
                live: dict[str, torch.Tensor] = {}

                def record(x, hook, sidx=sidx):
                    live["a"] = x[0] if sidx is None else x[0, :, sidx]

                def cut(x, hook, vidx=vidx, ref=ref):
                    x = x.clone()
                    if vidx is None:
                        x[0] -= live["a"] - ref
                    else:
                        x[0, :, vidx] -= live["a"] - ref
                    return x

                hooks = [(sname, record), (vname, cut)]
            logits = model.run_with_hooks(torch.tensor([it.ids]), fwd_hooks=hooks)[0, it.last_prompt_pos]
            out.append(float(logits[it.target_ids[0]] - logits[p.corrupt_label]))
    return float(np.mean(out))


def test_single_edge_effects_equal_a_hand_written_patch(tiny):
    g = Graph.from_model(tiny)
    edges = g.edges()
    picks = [0, 7, len(edges) // 2, len(edges) - 1]  # from the input, into a head, the middle, into the logits
    effects = EA.edge_effects(tiny, g, SWAPS, picks)
    full = _hand_logit_diff(tiny, g, None)
    for i, e in zip(picks, effects):
        assert e == pytest.approx(full - _hand_logit_diff(tiny, g, edges[i]), rel=1e-3, abs=1e-5)
    assert np.abs(effects).max() > 1e-4


def test_edge_scores_follow_graph_edge_order(tiny):
    g = Graph.from_model(tiny)
    flat = EA.edge_scores(tiny, g, SWAPS, 1, "right")
    matrix, _ = score_edges(tiny, g, make_pairs(tiny, SWAPS), steps=1, metric="logit_diff")
    for i in (0, 11, len(flat) - 1):
        a, b = g.edges()[i]
        assert flat[i] == pytest.approx(float(matrix[g.sources.index(a), g.slots.index(b)]))


def test_edge_rows_and_swappable(tiny):
    assert EA.swappable(tiny, SWAPS) == SWAPS
    lone = [*SWAPS[:1], Example("A dog is a", " animal", {"subject": "Zzyzx River Road"})]
    assert EA.edge_table(tiny, lone, {"steps": 2, "rule": "right"}) is None  # no swap: no edge rows
    found = EA.edge_table(tiny, SWAPS, {"steps": 2, "rule": "right"}, n_top=4, n_random=4)
    assert found is not None
    scores, effects, edges, n_examples = found
    assert n_examples == 4 and 4 <= len(edges) <= 12 and len(effects) == len(edges)
    rows = EA.edge_rows("facts", found, stat_row)  # with bootstrap intervals, as the experiment runs it
    assert rows["method"].tolist() == ["EAP", "EAP-IG"] and set(rows["component"]) == {"circuit edge"}
    assert all(math.isfinite(v) for v in rows["pearson"]) and (rows["n_units"] == len(edges)).all()
    assert list(rows.columns) == PA.COLUMNS and (rows["pearson_lo"] <= rows["pearson_hi"]).all()
