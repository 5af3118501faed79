"""NeuronScores / NeuronSet: selection rules, set algebra, accounting, save/load."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch

from capinterp._version import __version__
from capinterp.units import neurons as nmod
from capinterp.units.base import KeySet, UnitSet
from capinterp.units.neurons import NeuronScores, NeuronSet

L, D = 4, 50


def planted(seed: int = 0, big: float = 1.0, noise: float = 1e-3, width: int = 500):
    """Gaussian noise plus three huge positive and two huge negative neurons in a [4, width] map."""
    g = torch.Generator().manual_seed(seed)
    s = torch.randn(L, width, generator=g) * noise
    pos, neg = {(0, 3), (2, 17), (3, width - 1)}, {(1, 0), (2, 30)}
    for l, i in pos:
        s[l, i] = big
    for l, i in neg:
        s[l, i] = -big
    return NeuronScores(s, {"method": "test"}), pos, neg


# --- NeuronScores ------------------------------------------------------------------------------
def test_scores_basics_and_numpy_input():
    arr = np.arange(L * D, dtype=np.float64).reshape(L, D)
    sc = NeuronScores(arr, {"method": "m"})
    assert sc.scores.dtype == torch.float32 and sc.scores.device.type == "cpu"
    assert (sc.n_layers, sc.d_mlp, sc.shape) == (L, D, (L, D))
    assert torch.equal(sc[2], torch.arange(2 * D, 3 * D, dtype=torch.float32))
    assert sc.meta["version"] == __version__ and sc.meta["method"] == "m"
    assert "4 layers x 50 neurons" in repr(sc) and "'m'" in repr(sc)


def test_scores_copy_input_and_reject_bad_shapes():
    t = torch.zeros(L, D)
    sc = NeuronScores(t)
    t[0, 0] = 5.0
    assert sc.scores[0, 0] == 0.0
    with pytest.raises(ValueError, match="n_layers, d_mlp"):
        NeuronScores(torch.zeros(3))
    with pytest.raises(ValueError, match="non-finite"):
        NeuronScores(torch.tensor([[0.0, float("nan")]]))


def test_select_finds_planted_two_sided():
    sc, pos, neg = planted()
    got = sc.select(sigma=6.0)
    assert set(got) == pos | neg
    assert got.meta["selection"]["criterion"] == "sigma" and got.meta["method"] == "test"


def test_select_one_sided_keeps_only_positive():
    sc, pos, _ = planted()
    assert set(sc.select(sigma=6.0, two_sided=False)) == pos


def test_select_var_vs_std():
    # probability-sized scores: std ~1.9e-4 but var ~3.5e-8, so 6*var flags the noise as well
    sc, pos, neg = planted(big=1e-2, noise=1e-4, width=500)
    by_var = sc.select(sigma=6.0, spread="var")
    assert set(sc.select(sigma=6.0, spread="std")) < set(by_var)
    s = sc.scores.double()
    expected = int(((s - s.mean()).abs() > 6 * s.var(correction=0)).sum())
    assert len(by_var) == expected > len(pos | neg)


def test_select_uses_global_population_std_and_bad_args():
    s = torch.zeros(1, 10)
    s[0, :5] = 1.0  # mean .5, population std .5 -> every |dev| = .5
    sc = NeuronScores(s)
    assert len(sc.select(sigma=0.99)) == 10 and len(sc.select(sigma=1.0)) == 0
    with pytest.raises(ValueError):
        sc.select(sigma=0)
    with pytest.raises(ValueError):
        sc.select(spread="mad")


def test_top_k_and_abs_and_ties():
    s = torch.tensor([[0.5, -3.0, 2.0], [1.0, 1.0, 0.0]])
    sc = NeuronScores(s)
    assert list(sc.top_k(2)) == [(0, 2), (1, 0)]  # 2.0, then the first of the tied 1.0s
    assert list(sc.top_k(1, by="abs")) == [(0, 1)]
    assert len(sc.top_k(0)) == 0 and len(sc.top_k(6)) == 6
    with pytest.raises(ValueError):
        sc.top_k(7)


def test_threshold_absolute_and_relative():
    s = torch.tensor([[0.1, 0.5, -2.0], [0.25, 1.0, 0.19]])
    sc = NeuronScores(s)
    assert set(sc.threshold(0.2)) == {(0, 1), (1, 0), (1, 1)}
    assert set(sc.threshold(0.2, relative=True)) == {(0, 1), (1, 0), (1, 1)}  # cut 0.2 * 1.0
    assert set(sc.threshold(0.5, relative=True)) == {(1, 1)}
    neg_only = NeuronScores(-torch.ones(2, 2))  # max <= 0: only positive scores count
    assert len(neg_only.threshold(0.2, relative=True)) == 0


def test_scores_to_frame():
    sc = NeuronScores(torch.tensor([[0.1, -0.9], [0.5, 0.0]]))
    df = sc.to_frame()
    assert list(df.columns) == ["layer", "neuron", "score"] and len(df) == 4
    top = sc.to_frame(top=2)  # the largest scores, as top_k(2)
    assert list(zip(top.layer, top.neuron)) == [(1, 0), (0, 0)]
    assert list(zip(sc.to_frame(top=2, by="abs").layer, sc.to_frame(top=2, by="abs").neuron)) == [(0, 1), (1, 0)]
    with pytest.raises(ValueError, match="by must be"):
        sc.to_frame(top=2, by="signed")


@pytest.mark.parametrize("by", ["score", "abs"])
def test_top_means_one_thing(by):
    """to_frame(top=k) lists exactly the neurons top_k(k) selects, with the same ranking key."""
    g = torch.Generator().manual_seed(0)
    sc = NeuronScores(torch.randn(4, 32, generator=g))
    for k in (1, 5, 20):
        frame = sc.to_frame(top=k, by=by)
        assert set(zip(frame.layer, frame.neuron)) == set(sc.top_k(k, by=by))
        ranked = sc.top_k(k, by=by).to_frame(sc)  # a set's frame with scores: ranked, scores shown
        assert "score" in ranked and list(ranked.score) == sorted(ranked.score, reverse=True)
        if by == "score":
            assert list(zip(ranked.layer, ranked.neuron)) == list(zip(frame.layer, frame.neuron))


# --- NeuronSet ---------------------------------------------------------------------------------
def mk(pairs, meta=None, shape=(3, 5)):
    return NeuronSet.from_indices(pairs, *shape, meta=meta)


def test_set_is_unitset_with_keys_and_order():
    ns = mk([(2, 1), (0, 4), (0, 2)])
    assert isinstance(ns, UnitSet) and ns.kind == "neuron" and ns.space == ("neuron", 3, 5)
    assert list(ns) == [(0, 2), (0, 4), (2, 1)]
    assert ns.keys() == frozenset({(0, 2), (0, 4), (2, 1)}) and len(ns) == 3
    assert (0, 4) in ns and (0, 3) not in ns and (9, 9) not in ns and "x" not in ns and (0, 4.0) not in ns
    assert all(type(v) is int for p in ns for v in p)


def test_set_algebra():
    a, b = mk([(0, 1), (0, 2), (1, 3)]), mk([(0, 2), (1, 3), (1, 4), (2, 0)])
    assert set(a & b) == {(0, 2), (1, 3)}
    assert set(a | b) == {(0, 1), (0, 2), (1, 3), (1, 4), (2, 0)}
    assert set(a - b) == {(0, 1)} and set(b - a) == {(1, 4), (2, 0)}
    assert set(a ^ b) == {(0, 1), (1, 4), (2, 0)}
    assert a == mk([(1, 3), (0, 2), (0, 1)]) and a != b
    with pytest.raises(ValueError, match=r"\(3, 5\).*\(4, 5\)"):
        a & mk([(0, 1)], shape=(4, 5))
    with pytest.raises(TypeError):
        a & {(0, 1)}


def test_algebra_keeps_agreed_model_meta_and_rejects_other_fingerprints():
    a = mk([(0, 1)], {"model": "m", "n_params": 100, "method": "x", "model_fingerprint": "f1"})
    b = mk([(0, 2)], {"model": "m", "n_params": 200, "model_fingerprint": "f1"})
    u = a | b
    assert u.meta["model"] == "m" and "n_params" not in u.meta and "method" not in u.meta
    with pytest.raises(ValueError, match="fingerprint"):
        a | mk([(0, 2)], {"model_fingerprint": "f2"})


def test_ratio_param_share_per_layer():
    ns = mk([(0, 1), (0, 2), (2, 4)], {"params_per_neuron": 10, "n_params": 600})
    assert ns.ratio == pytest.approx(3 / 15)
    assert ns.param_share == pytest.approx(30 / 600)
    assert ns.per_layer().tolist() == [2, 0, 1]
    with pytest.raises(ValueError, match="params_per_neuron"):
        _ = mk([(0, 1)]).param_share


def test_mask_input_validation_and_from_indices_range():
    assert len(NeuronSet(np.array([[0, 1], [1, 1]]))) == 3
    with pytest.raises(ValueError, match="0/1"):
        NeuronSet(torch.tensor([[0, 2]]))
    with pytest.raises(ValueError, match="out of range"):
        mk([(3, 0)])


def test_set_to_frame_with_scores():
    ns = mk([(1, 2), (0, 0)])
    s = torch.arange(15, dtype=torch.float32).view(3, 5)
    df = ns.to_frame(NeuronScores(s))
    assert df.to_dict("list") == {"layer": [1, 0], "neuron": [2, 0], "score": [7.0, 0.0]}  # ranked by score
    assert list(ns.to_frame().columns) == ["layer", "neuron"]


def test_empty_and_random_like():
    base = mk([(0, 0), (0, 1), (0, 2), (2, 3)], {"model": "m", "method": "x"})
    assert len(base.empty_like()) == 0 and base.empty_like().meta["model"] == "m"
    r1, r2 = base.random_like(seed=1), base.random_like(seed=1)
    assert r1 == r2 and len(r1) == 4 and r1.meta["random_control"]["seed"] == 1
    assert any(base.random_like(seed=s) != r1 for s in range(2, 6))
    pl = base.random_like(seed=3, per_layer=True)
    assert pl.per_layer().tolist() == base.per_layer().tolist()
    dj = base.random_like(seed=4, disjoint=True)
    assert len(dj) == 4 and len(dj & base) == 0
    with pytest.raises(ValueError, match="disjoint"):
        NeuronSet(torch.ones(1, 3, dtype=torch.bool)).random_like(0, disjoint=True)


def test_check_compatible_messages():
    ns = NeuronSet(torch.zeros(30, 1536, dtype=torch.bool), {"model_fingerprint": "abc"})
    ns.check_compatible((30, 1536), fingerprint="abc")
    with pytest.raises(ValueError, match="30 layers x 1536 neurons; this model has 18 x 2048"):
        ns.check_compatible((18, 2048))
    with pytest.raises(ValueError, match="fingerprint"):
        ns.check_compatible((30, 1536), fingerprint="zzz")

    class Cfg:
        n_layers, d_mlp = 18, 2048

    class Model:
        cfg = Cfg()

    with pytest.raises(ValueError, match="18 x 2048"):
        NeuronScores(torch.zeros(30, 1536)).check_compatible(Model())


def test_keyset_algebra_and_accounting():
    a = KeySet.layers([3, 4, 5], n_layers=10, unit_params=7, n_params=700)
    b = KeySet.layers([5, 6], n_layers=10)
    assert a.kind == "layer" and a.space == ("layer", 10) and list(a) == [3, 4, 5]
    assert set(a & b) == {5} and set(a | b) == {3, 4, 5, 6} and set(a - b) == {3, 4} and set(a ^ b) == {3, 4, 6}
    assert a.ratio == pytest.approx(0.3) and a.param_share == pytest.approx(21 / 700)
    counts = {("m0", "m1"): 5, ("m1", "logits"): 3}
    e = KeySet(set(counts), "edge", unit_params=counts, n_params=80)
    assert e.param_share == pytest.approx(0.1) and ("m0", "m1") in e
    with pytest.raises(ValueError, match="n_params"):
        _ = b.param_share
    with pytest.raises(ValueError, match="kinds or spaces"):
        a & KeySet.layers([1], n_layers=12)
    with pytest.raises(ValueError):
        KeySet.layers([10], n_layers=10)


# --- save / load -------------------------------------------------------------------------------
META = {
    "method": "cnl",
    "params": {"sigma": 6.0, "m": 20, "rule": "right"},
    "model": "tiny",
    "model_fingerprint": "fp0",
    "n_params": 1000,
    "params_per_neuron": 12,
    "dataset": "toy",
    "n_samples": 7,
}


@pytest.mark.parametrize("as_folder", [False, True])
def test_round_trip_scores_and_set(tmp_path, as_folder):
    sc = NeuronScores(torch.randn(L, D, generator=torch.Generator().manual_seed(0)), META)
    ns = sc.top_k(9)
    for obj, name in ((sc, "s"), (ns, "n")):
        path = tmp_path / (name + "/" if as_folder else name + ".capi")
        obj.save(str(path) + ("/" if as_folder else ""))
        assert path.is_dir() == as_folder
        back = type(obj).load(path)
        assert type(back) is type(obj) and back.meta == obj.meta
        assert torch.equal(back._data(), obj._data()) and back._data().dtype == obj._data().dtype
        generic = nmod.load(path)
        assert type(generic) is type(obj)
    assert nmod.load(tmp_path / ("n" if as_folder else "n.capi")) == ns


def test_file_layout_is_safetensors_with_json_metadata(tmp_path):
    from safetensors import safe_open

    ns = NeuronSet(torch.eye(3, dtype=torch.bool), META)
    ns.save(tmp_path / "x.capi")
    with safe_open(str(tmp_path / "x.capi"), framework="pt") as f:
        assert list(f.keys()) == ["mask"] and f.get_tensor("mask").dtype == torch.uint8
        hdr = json.loads(f.metadata()["capinterp"])
    assert hdr["type"] == "NeuronSet" and hdr["format_version"] == nmod.FORMAT_VERSION and hdr["shape"] == [3, 3]
    assert hdr["meta"]["params"] == META["params"]


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.capi"):
        NeuronScores.load(tmp_path / "nope.capi")
    (tmp_path / "emptydir").mkdir()
    with pytest.raises(FileNotFoundError, match="meta.json"):
        nmod.load(tmp_path / "emptydir")


@pytest.mark.parametrize("damage", ["truncate", "random", "json", "empty", "no_meta"])
def test_corrupted_files_raise_clear_value_error(tmp_path, damage):
    p = tmp_path / "s.capi"
    NeuronScores(torch.randn(L, D), META).save(p)
    raw = p.read_bytes()
    if damage == "truncate":
        p.write_bytes(raw[: len(raw) - 100])
    elif damage == "random":
        p.write_bytes(np.random.default_rng(0).bytes(len(raw)))
    elif damage == "json":
        p.write_text(json.dumps({"scores": [[1, 2]]}))
    elif damage == "empty":
        p.write_bytes(b"")
    else:
        from safetensors.torch import save_file

        save_file({"scores": torch.zeros(L, D)}, str(p))
    with pytest.raises(ValueError, match="is not a valid capinterp file"):
        NeuronScores.load(p)


def test_corrupted_folder_meta(tmp_path):
    d = tmp_path / "f"
    NeuronScores(torch.zeros(2, 3)).save(str(d) + "/")
    (d / "meta.json").write_text("{not json")
    with pytest.raises(ValueError, match="is not a valid capinterp file"):
        nmod.load(d)


def test_wrong_type_and_shape_checks(tmp_path):
    p = tmp_path / "s.capi"
    NeuronScores(torch.zeros(L, D), META).save(p)
    with pytest.raises(ValueError, match="holds a NeuronScores, not a NeuronSet"):
        NeuronSet.load(p)
    with pytest.raises(ValueError, match="4 layers x 50 neurons; this model has 5 x 50"):
        NeuronScores.load(p, expected_shape=(5, 50))
    with pytest.raises(ValueError, match="this model has 4 x 51"):
        nmod.load(p, model_shape=(4, 51))
    with pytest.raises(ValueError, match="fingerprint"):
        NeuronScores.load(p, fingerprint="other")
    assert NeuronScores.load(p, expected_shape=(L, D), fingerprint="fp0").shape == (L, D)


def test_metadata_shape_mismatch(tmp_path):
    from safetensors.torch import save_file

    hdr = {"type": "NeuronScores", "format_version": 1, "shape": [3, 3], "meta": {}}
    save_file({"scores": torch.zeros(2, 3)}, str(tmp_path / "bad.capi"), metadata={"capinterp": json.dumps(hdr)})
    with pytest.raises(ValueError, match="does not match the stored tensor"):
        nmod.load(tmp_path / "bad.capi")
    hdr.update(format_version=99, shape=[2, 3])
    save_file({"scores": torch.zeros(2, 3)}, str(tmp_path / "new.capi"), metadata={"capinterp": json.dumps(hdr)})
    with pytest.raises(ValueError, match="format_version"):
        nmod.load(tmp_path / "new.capi")


def test_unserializable_meta_is_a_clear_error(tmp_path):
    with pytest.raises(TypeError, match="not JSON-serializable"):
        NeuronScores(torch.zeros(1, 2), {"obj": object()}).save(tmp_path / "x.capi")
    ok = NeuronScores(torch.zeros(1, 2), {"n": np.int64(3), "t": torch.tensor(2.5)})
    ok.save(tmp_path / "y.capi")
    assert NeuronScores.load(tmp_path / "y.capi").meta["n"] == 3


def test_plot_delegates():
    sc, _, _ = planted()
    assert sc.plot().data[0].type == "heatmap" and sc.select().plot().data[0].type == "heatmap"
    assert isinstance(sc.to_frame(), pd.DataFrame)


def test_load_checks_against_a_model(tmp_path):
    """``NeuronSet.load(path, model=m)`` (documented in getting-started) checks shape and fingerprint."""
    import capinterp as ci

    a, b = ci.load_model("tiny", seed=0), ci.load_model("tiny", seed=1)
    ns = ci.DCSN(a).fit(ci.data.arithmetic(ops="+", n=4, seed=0)).neurons_
    path = ns.save(tmp_path / "set.capi")
    assert NeuronSet.load(path, model=a) == ns
    assert nmod.load(path, model=a) == ns
    with pytest.raises(ValueError, match="across_models=True"):
        NeuronSet.load(path, model=b)
    assert NeuronSet.load(path, model=b, across_models=True) == ns  # same architecture, other weights
    with pytest.raises(ValueError, match="layers"):
        NeuronSet.load(path, model=ci.load_model("tiny", n_layers=2))
