"""KeySet save / load: layer, expert and edge results reach the disk and come back exactly, with
their model identity; damaged files, other files and other models are refused with a clear error."""

from __future__ import annotations

import json

import pytest
import torch

import capinterp as ci
from capinterp.arch.model import model_meta
from capinterp.units.base import KeySet
from capinterp.units.keyset_io import decode_key, encode_key
from capinterp.units.saved import IDENTITY_UNKNOWN


@pytest.fixture
def layers(tiny):
    return KeySet.layers([1, 0], int(tiny.cfg.n_layers), unit_params=12, n_params=1000, meta=model_meta(tiny))


def test_layers_round_trip_with_their_identity(tmp_path, tiny, layers):
    back = KeySet.load(layers.save(tmp_path / "layers.json"), model=tiny)
    assert back == layers and back.space == layers.space and type(back) is KeySet
    assert (back.unit_params, back.n_params, back.n_units) == (12, 1000, layers.n_units)
    assert back.meta["model_fingerprint"] == layers.meta["model_fingerprint"]
    assert IDENTITY_UNKNOWN not in back.meta
    assert back.param_share == layers.param_share


def test_keys_of_every_hashable_kind_round_trip_exactly(tmp_path):
    keys = [(3, "shared"), (0, 1), 7, 1.5, "node", None, True, (1, (2, "x")), frozenset({1, "a"}), (1.0,)]
    ks = KeySet(keys, "expert", ("expert", 4, 8, True, (0, 2)), unit_params={(0, 1): 5, 7: 2}, n_units=40)
    back = KeySet.load(ks.save(tmp_path / "k.json"))
    assert back.keys() == ks.keys() and back.space == ks.space and back.unit_params == ks.unit_params
    by_repr = {repr(k): k for k in back}
    assert type(by_repr["True"]) is bool and type(by_repr["(1.0,)"][0]) is float and type(by_repr["7"]) is int
    assert all(decode_key(encode_key(k)) == k for k in keys)


def test_an_unsaveable_key_is_refused_before_the_file_is_touched(tmp_path):
    p = tmp_path / "k.json"
    with pytest.raises(TypeError, match="key of type bytes"):
        KeySet([b"x"], "node").save(p)  # bytes: no JSON spelling
    with pytest.raises(ValueError, match="non-finite"):
        KeySet([float("nan")], "node").save(p)
    assert not p.exists()


def test_expert_results_of_a_moe_model_save_and_load(tmp_path):
    from moe_tiny import load_tiny_moe

    from capinterp.units.experts import top_experts

    model = load_tiny_moe("qwen2_moe")[0]
    moe = model.capinterp_family.moe
    scores = torch.zeros(model.cfg.n_layers, moe.width)
    scores[1, 2 * moe.d_expert : 3 * moe.d_expert] = 1.0
    scores[0, -1] = 0.5
    top = top_experts(model, scores, 2).with_meta(model_meta(model))
    back = KeySet.load(top.save(tmp_path / "experts.json"), model=model)
    assert back == top and back.keys() == {(1, 2), (0, "shared")} and back.space == top.space
    assert back.ratio == top.ratio


def test_a_file_without_identity_is_marked_and_refused_on_a_model(tmp_path, tiny):
    ks = KeySet.layers([0], int(tiny.cfg.n_layers))
    back = KeySet.load(ks.save(tmp_path / "k.json"))
    assert back == ks and back.meta[IDENTITY_UNKNOWN] == str(tmp_path / "k.json")
    with pytest.raises(ValueError, match="records no model identity"):
        KeySet.load(tmp_path / "k.json", model=tiny)
    KeySet.load(tmp_path / "k.json", model=tiny, across_models=True)


def test_a_set_of_another_model_is_refused(tmp_path, tiny, layers):
    other = layers.with_meta({**layers.meta, "model_fingerprint": "0" * 16})
    p = other.save(tmp_path / "other.json")
    with pytest.raises(ValueError, match="model_fingerprint"):
        KeySet.load(p, model=tiny)
    wide = KeySet.layers([0], int(tiny.cfg.n_layers) + 1, meta=layers.meta)
    with pytest.raises(ValueError, match="layers"):
        KeySet.load(wide.save(tmp_path / "wide.json"), model=tiny)


def test_damaged_and_foreign_files_are_refused(tmp_path, layers):
    p = layers.save(tmp_path / "k.json")
    d = json.loads(p.read_text())
    d["keys"].append(5)  # an edited file: the checksum no longer matches
    p.write_text(json.dumps(d))
    with pytest.raises(ValueError, match=r"k\.json is not a valid saved KeySet.*checksum"):
        KeySet.load(p)
    p.write_text(p.read_text()[:-9])  # truncated
    with pytest.raises(ValueError, match="not a valid saved KeySet"):
        KeySet.load(p)
    with pytest.raises(FileNotFoundError, match="no saved KeySet"):
        KeySet.load(tmp_path / "missing.json")
    other = tmp_path / "notes.json"
    other.write_text('{"type": "Circuit"}')
    with pytest.raises(ValueError, match="not a valid saved KeySet"):
        KeySet.load(other)
    with pytest.raises(ValueError, match="overwrite=True"):
        layers.save(other)  # never over a file of another kind
    layers.save(other, overwrite=True)
    assert KeySet.load(other) == layers


def test_set_algebra_keeps_the_model_identity_only(layers):
    a = layers.with_meta({**layers.meta, "method": "causal_trace"})
    both = a | KeySet.layers([2], a.space[1], meta=layers.meta)
    assert both.meta["model_fingerprint"] == layers.meta["model_fingerprint"] and "method" not in both.meta
    with pytest.raises(TypeError, match="meta must be a mapping"):
        KeySet([1], "node", meta=[1])  # type: ignore[arg-type]


def test_a_layer_localizer_result_saves_with_its_fit(tmp_path, tiny):
    facts = ci.testing.check_facts(tiny)
    loc = ci.CausalTrace(tiny, samples=2, progress=False).fit(facts)
    assert loc.units_.meta["method"] == "causal_trace" and loc.units_.meta == loc.meta_
    back = KeySet.load(loc.units_.save(tmp_path / "layers.json"), model=tiny)
    assert back == loc.units_ and back.meta["method"] == "causal_trace"


def test_a_subclass_does_not_load_a_plain_keyset_file(tmp_path):
    from capinterp.circuits.graph import EdgeSet

    with pytest.raises(TypeError, match="EdgeSet.load: KeySet.load reads plain KeySet files only"):
        EdgeSet.load(tmp_path / "x.keys")
