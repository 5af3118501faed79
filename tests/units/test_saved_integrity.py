"""Saved results do not trust their headers (issue 51, items 3 and 6).

Every saved type (NeuronScores, NeuronSet: ``.capi`` file and folder; Circuit: JSON) refuses an edited
header or payload; a file without model identity is refused where a model's identity is checked; saves
are atomic, never replace an unrelated file without ``overwrite=True``, and replace a link, not its target.
"""

from __future__ import annotations

import json

import pytest
import torch

import capinterp as ci
from capinterp.arch.model import load_model, model_meta
from capinterp.circuits.graph import Circuit, Graph
from capinterp.circuits.hit import hit_at_k
from capinterp.core import atomic
from capinterp.units.neurons import NeuronScores, NeuronSet, load

FACTS = [("The Eiffel Tower is in", " Paris")]


@pytest.fixture(scope="module")
def other():
    """A model of the tiny's shape and architecture, with other weights."""
    return load_model("tiny", seed=1)


def _scores(model) -> NeuronScores:
    L, d = model.cfg.n_layers, model.cfg.d_mlp
    meta = {"method": "kn", "params": {"steps": 20}, **model_meta(model)}
    return NeuronScores(torch.arange(L * d, dtype=torch.float32).view(L, d), meta)


def _result(kind: str, model):
    s = _scores(model)
    return s if kind == "NeuronScores" else s.top_k(3)


def _capi_header(p):
    from safetensors import safe_open

    src = p / "tensors.safetensors" if p.is_dir() else p
    with safe_open(str(src), framework="pt") as f:
        hdr = json.loads(f.metadata()["capinterp"])
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open is not iterable)
    if p.is_dir():
        hdr = json.loads((p / "meta.json").read_text())
    return hdr, tensors


def _capi_rewrite(p, hdr, tensors):
    from safetensors.torch import save_file

    blob = json.dumps(hdr)
    if p.is_dir():
        (p / "meta.json").write_text(blob)
        save_file(tensors, str(p / "tensors.safetensors"), metadata={"capinterp": blob})
    else:
        save_file(tensors, str(p), metadata={"capinterp": blob})


EDITS = {
    "fingerprint": lambda h: h["meta"].update(model_fingerprint="0" * 16),
    "no fingerprint": lambda h: h["meta"].pop("model_fingerprint"),
    "method": lambda h: h["meta"].update(method="cnl"),
    "model name": lambda h: h["meta"].update(model="smollm2"),
    "params": lambda h: h["meta"]["params"].update(steps=21),
}


@pytest.mark.parametrize("kind", ["NeuronScores", "NeuronSet"])
@pytest.mark.parametrize("folder", [False, True], ids=["file", "folder"])
@pytest.mark.parametrize("edit", list(EDITS))
def test_capi_header_edit_is_refused(tiny, tmp_path, kind, folder, edit):
    p = _result(kind, tiny).save(str(tmp_path / "r") + ("/" if folder else ".capi"))
    hdr, tensors = _capi_header(p)
    assert hdr["format_version"] == 3 and "header_checksum" in hdr
    EDITS[edit](hdr)
    _capi_rewrite(p, hdr, tensors)
    with pytest.raises(ValueError, match="header checksum.*edited or damaged"):
        load(p)


@pytest.mark.parametrize("version", [1, 2])
def test_changed_byte_in_an_old_format_file_is_refused(tiny, tmp_path, version):
    p = _scores(tiny).save(tmp_path / "s.capi")
    hdr, tensors = _capi_header(p)
    hdr.pop("header_checksum")
    hdr["format_version"] = version  # an older format: its tensor checksum is still verified
    tensors["scores"][0, 0] += 1.0
    _capi_rewrite(p, hdr, tensors)
    with pytest.raises(ValueError, match="does not match its stored checksum"):
        load(p)


def test_format3_without_its_header_checksum_is_refused(tiny, tmp_path):
    p = _scores(tiny).save(tmp_path / "s.capi")
    hdr, tensors = _capi_header(p)
    hdr.pop("header_checksum")
    _capi_rewrite(p, hdr, tensors)
    with pytest.raises(ValueError, match="without its checksums"):
        load(p)


def test_file_without_identity_is_refused_by_erase_on_another_model(tiny, other, tmp_path):
    # a format-2 file (no header checksum) whose fingerprint was deleted still loads ...
    p = _result("NeuronSet", tiny).save(tmp_path / "n.capi")
    hdr, tensors = _capi_header(p)
    hdr.pop("header_checksum")
    hdr["format_version"] = 2
    hdr["meta"].pop("model_fingerprint")
    _capi_rewrite(p, hdr, tensors)
    ns = NeuronSet.load(p)
    # ... but applying it to a model is refused: it cannot be checked (today: erases model B silently)
    with pytest.raises(ValueError, match="records no model identity.*across_models=True"), ci.erase(other, ns):
        pass
    with pytest.raises(ValueError, match="records no model identity"), ci.amplify(tiny, ns | ns.empty_like()):
        pass  # derived sets keep the mark
    with pytest.raises(ValueError, match="records no model identity"):
        load(p, model=other)
    with ci.erase(other, ns, across_models=True):  # the explicit opt-in
        pass
    # a set built in memory (not from a file) is not affected
    with ci.erase(tiny, NeuronSet(ns.mask.clone())):
        pass


def test_round_trip_still_loads(tiny, tmp_path):
    for kind in ("NeuronScores", "NeuronSet"):
        r = _result(kind, tiny)
        back = load(r.save(tmp_path / f"{kind}.capi"), model=tiny)
        assert back.meta == r.meta


# --------------------------------------------------------------------------- circuits


def _circuit(model) -> Circuit:
    g = Graph.from_model(model)
    scores = torch.linspace(-1, 1, g.n_src * g.n_slots).view(g.n_src, g.n_slots)
    meta = {"method": "knowledge_circuit", "algorithm": "eap", **model_meta(model)}
    return Circuit(g, g.edge_mask & (scores.abs() > 0.5), scores, meta)


def _edit_circuit(p, fn, keep_checksum=True):
    d = json.loads(p.read_text())
    fn(d)
    if not keep_checksum:
        d.pop("checksum", None)
    p.write_text(json.dumps(d))


CIRCUIT_EDITS = {
    "fingerprint": lambda d: d["meta"].update(model_fingerprint="0" * 16),
    "no fingerprint": lambda d: d["meta"].pop("model_fingerprint"),
    "model name": lambda d: d["meta"].update(model="gemma3"),
    "edge score": lambda d: d["edges"][0].__setitem__(2, 99.0),
    "scores": lambda d: d["scores"].__setitem__(0, 99.0),
    "structure": lambda d: d["edges"][0].__setitem__(0, "a9.h9"),
}


@pytest.mark.parametrize("edit", list(CIRCUIT_EDITS))
def test_circuit_edit_is_refused(tiny, tmp_path, edit):
    p = _circuit(tiny).save(tmp_path / "c.json")
    assert json.loads(p.read_text())["format_version"] == 4
    _edit_circuit(p, CIRCUIT_EDITS[edit])
    with pytest.raises(ValueError, match=r"c\.json.*does not match its checksum"):
        Circuit.load(p)


@pytest.mark.parametrize(
    "damage",
    [
        lambda d: d["edges"][0].__setitem__(0, "a9.h9"),  # a node the graph has not
        lambda d: d["edges"].append(["logits", "input", None]),  # no such edge
        lambda d: d.pop("graph"),
        lambda d: d["scores"].pop(),
    ],
)
def test_structural_damage_in_an_old_circuit_is_a_clear_error(tiny, tmp_path, damage):
    p = _circuit(tiny).save(tmp_path / "c.json")

    def old(d):
        d["format_version"] = 1  # before checksums: loads unverified, damage still named
        damage(d)

    _edit_circuit(p, old, keep_checksum=False)
    with pytest.raises(ValueError, match=r"c\.json is not a valid saved Circuit: a damaged Circuit") as e:
        Circuit.load(p)
    assert type(e.value) is ValueError


def test_circuit_of_another_model_is_refused_by_hit_at_k(tiny, other, tmp_path):
    c = Circuit.load(_circuit(tiny).save(tmp_path / "c.json"))
    with pytest.raises(ValueError, match="weights or config differ.*across_models=True"):
        hit_at_k(other, c, FACTS, 1)
    with pytest.raises(ValueError, match="weights or config differ"):
        ci.faithfulness(other, c, FACTS)
    assert hit_at_k(other, c, FACTS, 1, across_models=True)["n"] == 1
    # an old file without its fingerprint: no identity, refused unless across_models
    _edit_circuit(
        tmp_path / "c.json", lambda d: (d["meta"].pop("model_fingerprint"), d.update(format_version=1)), False
    )
    anon = Circuit.load(tmp_path / "c.json")
    with pytest.raises(ValueError, match="records no model identity"):
        hit_at_k(other, anon, FACTS, 1)
    with pytest.raises(ValueError, match="records no model identity"):
        Circuit.load(tmp_path / "c.json", model=tiny)
    assert hit_at_k(other, anon, FACTS, 1, across_models=True)["n"] == 1


# --------------------------------------------------------------------------- one save routine


def _save(kind: str, model, path, **kw):
    obj = _circuit(model) if kind == "Circuit" else _result(kind, model)
    return obj.save(path, **kw)


KINDS = ["NeuronScores", "NeuronSet", "Circuit"]


@pytest.mark.parametrize("kind", KINDS)
def test_save_refuses_an_unrelated_file_without_overwrite(tiny, tmp_path, kind):
    p = tmp_path / "notes.json"
    p.write_text('{"mine": 1}')
    with pytest.raises(ValueError, match="not a capinterp file.*overwrite=True"):
        _save(kind, tiny, p)
    assert p.read_text() == '{"mine": 1}'
    other_kind = "NeuronScores" if kind != "NeuronScores" else "Circuit"
    _save(other_kind, tiny, tmp_path / "r", overwrite=True)
    with pytest.raises(ValueError, match=f"a saved {other_kind}"):
        _save(kind, tiny, tmp_path / "r")
    _save(kind, tiny, tmp_path / "r", overwrite=True)
    _save(kind, tiny, tmp_path / "r")  # replacing a result of its own type is fine


@pytest.mark.parametrize("kind", KINDS)
def test_crash_mid_save_keeps_the_old_file(tiny, tmp_path, monkeypatch, kind):
    p = _save(kind, tiny, tmp_path / "r")
    before = p.read_bytes()

    def crash(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(atomic.os, "replace", crash)
    with pytest.raises(OSError, match="No space"):
        _save(kind, tiny, p)
    assert p.read_bytes() == before
    assert [x.name for x in tmp_path.iterdir()] == ["r"]  # no temporary left behind


@pytest.mark.parametrize("kind", KINDS)
def test_saving_onto_a_link_replaces_the_link_not_its_target(tiny, tmp_path, kind):
    target = tmp_path / "precious.txt"
    target.write_text("keep me")
    link = tmp_path / "out"
    link.symlink_to(target)
    with pytest.raises(ValueError, match="link"):
        _save(kind, tiny, link)
    _save(kind, tiny, link, overwrite=True)
    assert target.read_text() == "keep me"
    assert not link.is_symlink()
    # a link to a saved result of the same type: replaced without overwrite, its target untouched
    old = _save(kind, tiny, tmp_path / "old")
    before = old.read_bytes()
    link2 = tmp_path / "out2"
    link2.symlink_to(old)
    _save(kind, tiny, link2)
    assert old.read_bytes() == before and not link2.is_symlink()


@pytest.mark.parametrize("kind", KINDS)
def test_longest_legal_name_saves(tiny, tmp_path, kind):
    p = _save(kind, tiny, tmp_path / ("r" * 250 + ".json"))  # 255 bytes
    assert p.exists() and [x.name for x in tmp_path.iterdir()] == [p.name]
