"""Where neurons' weights live (arch/neuron_weights.py) and copies that keep the model's wiring (core/params.py),
checked against the transformers modules by their own names."""

from __future__ import annotations

import pytest
import torch

import capinterp as ci
from capinterp.arch.family import UnsupportedFamily
from capinterp.arch.neuron_weights import down_weight, neuron_params, value_rows
from capinterp.arch.tiny import tiny_hf
from capinterp.core.params import copy_model, count_entries


def _load(family: str):
    hf, tok = tiny_hf(family)
    return hf, ci.load_model(hf, tokenizer=tok)


def _kinds(model, layer=0):
    return {p.kind: p for p in neuron_params(model, [layer])}


def test_linear_down_projection_is_read_as_columns():
    hf, model = _load("llama")
    w = hf.model.layers[1].mlp.down_proj.weight  # [d_model, d_mlp]
    got, axis = down_weight(model, 1)
    assert axis == 1 and got.data_ptr() == w.data_ptr()
    assert torch.equal(value_rows(model, 1), w.T)
    kinds = _kinds(model, 1)
    assert sorted(kinds) == ["W_gate", "W_in", "W_out"]
    assert kinds["W_in"].param.data_ptr() == hf.model.layers[1].mlp.up_proj.weight.data_ptr()
    assert kinds["W_gate"].param.data_ptr() == hf.model.layers[1].mlp.gate_proj.weight.data_ptr()
    assert kinds["W_in"].axis == 0 and kinds["W_gate"].axis == 0 and kinds["W_out"].axis == 1


def test_conv1d_is_read_as_rows_and_writes_reach_the_model():
    hf, model = _load("gpt2")
    mlp = hf.transformer.h[0].mlp
    _, axis = down_weight(model, 0)
    assert axis == 0 and torch.equal(value_rows(model, 0), mlp.c_proj.weight)  # Conv1D: [d_mlp, d_model]
    kinds = _kinds(model)
    assert sorted(kinds) == ["W_in", "W_out", "b_in"]
    assert kinds["W_in"].axis == 1 and kinds["W_out"].axis == 0  # c_fc: [d_model, d_mlp]
    with torch.no_grad():
        value_rows(model, 0)[5] = 0.0
    assert torch.count_nonzero(mlp.c_proj.weight[5]) == 0


def test_fused_gate_up_is_served_through_views_of_the_fused_weight():
    hf, model = _load("phi3")
    fused = hf.model.layers[0].mlp.gate_up_proj.weight  # [gate; up] rows
    kinds = _kinds(model)
    d_mlp = model.cfg.d_mlp
    assert torch.equal(kinds["W_gate"].param, fused[:d_mlp]) and torch.equal(kinds["W_in"].param, fused[d_mlp:])
    assert kinds["W_in"].param.untyped_storage().data_ptr() == fused.untyped_storage().data_ptr()


def test_a_projection_of_unknown_orientation_is_refused():
    _, model = _load("gpt2")

    class Odd(torch.nn.Module):  # neither nn.Linear-like nor Conv1D-like
        def __init__(self, w):
            super().__init__()
            self.weight = torch.nn.Parameter(w)

    out = model.blocks[0].mlp.out
    saved = out.original_component
    try:
        # an unknown module type whose weight is not [d_mlp, d_model] either way round: nothing tells its axis
        out._modules["_original_component"] = Odd(torch.zeros(5, 7))
        with pytest.raises(UnsupportedFamily, match="not a \\[96, 32\\] weight"):
            down_weight(model, 0)
    finally:
        out._modules["_original_component"] = saved


def test_count_entries_counts_shared_storage_once():
    base = torch.zeros(6, 4)
    top, bottom = base[:3], base[3:]
    assert count_entries([base, top, bottom]) == 24
    assert count_entries([top, top]) == 12
    assert count_entries([top, torch.zeros(5)]) == 17
    assert count_entries([base[:, 0], base[:, 1]]) == 12  # strided views: entries, not ranges
    assert count_entries([base[:, 0], base[:2]]) == 8 + 4


def test_copy_keeps_fused_views_linked():
    hf, model = _load("phi3")
    new = copy_model(model)
    fused = new.original_model.model.layers[0].mlp.gate_up_proj.weight
    up = new.blocks[0].mlp.W_in  # a view of the copy's fused weight, not the original's
    assert up.untyped_storage().data_ptr() == fused.untyped_storage().data_ptr()
    assert fused.untyped_storage().data_ptr() != hf.model.layers[0].mlp.gate_up_proj.weight.untyped_storage().data_ptr()
    with torch.no_grad():
        getattr(new.blocks[0].mlp, "in").original_component.weight[3] = 7.0
    assert (fused[model.cfg.d_mlp + 3] == 7.0).all()
    assert not (hf.model.layers[0].mlp.gate_up_proj.weight == 7.0).any()


def test_copy_computes_with_its_own_weights_when_forwards_are_patched():
    """TransformerLens patches every FalconLinear's forward with a closure over the module: a plain
    deepcopy would compute with the original's weights."""
    hf, model = _load("falcon")
    new = copy_model(model)
    ids = torch.tensor([[5, 6, 7]])
    with torch.no_grad():
        before = new(ids)[0, -1].clone()
        value_rows(new, 1).zero_()
        after = new(ids)[0, -1]
        original = model(ids)[0, -1]
    assert not torch.allclose(before, after)
    assert torch.equal(before, original)
    assert new.tokenizer is model.tokenizer
