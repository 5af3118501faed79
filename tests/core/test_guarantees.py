"""The guarantees of docs/guarantees.md, one class each: identity is the weights, inputs are
checked at the door, files detect damage and are never overwritten by accident, the CLI speaks
in one line."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch

import capinterp as ci
from capinterp.app.cli import main as cli
from capinterp.arch.model import load_model, model_fingerprint, model_meta
from capinterp.core.fingerprint import refresh_fingerprint, weights_digest
from capinterp.units import metrics
from capinterp.units.neurons import NeuronScores, NeuronSet

PROMPTS = [("1+1=", "2"), ("2+2=", "4"), ("3+1=", "4"), ("2+1=", "3")]


@pytest.fixture
def fresh():
    return load_model("tiny")


def _located(model, k: int = 3) -> NeuronSet:
    s = torch.arange(model.cfg.n_layers * model.cfg.d_mlp, dtype=torch.float32).view(model.cfg.n_layers, -1)
    return NeuronScores(s, model_meta(model)).top_k(k)


# ----------------------------------------------------------------------------- 1. identity
def test_fingerprint_follows_every_weight_write(fresh):
    before = model_fingerprint(fresh)
    w = fresh.blocks[2].mlp.out.original_component.weight
    with torch.no_grad():
        old = w[7, 3].clone()
        w[7, 3] += 1e-6  # one entry of one matrix
    changed = model_fingerprint(fresh)
    with torch.no_grad():
        w[7, 3] = old
    assert changed != before and model_fingerprint(fresh) == before  # identity is the weights, exactly


def test_fingerprint_catches_row_swaps_and_data_writes(fresh):
    before = model_fingerprint(fresh)
    w = fresh.blocks[0].mlp.out.original_component.weight
    with torch.no_grad():
        w[[0, 1]] = w[[1, 0]]
    assert model_fingerprint(fresh) != before
    with torch.no_grad():
        w[[0, 1]] = w[[1, 0]]
    assert model_fingerprint(fresh) == before
    w.data[0, 0] += 1.0  # bypasses torch's version counter: the cache needs a refresh
    refresh_fingerprint(fresh)
    assert model_fingerprint(fresh) != before


def test_fingerprint_separates_seeds_not_loads():
    a, b, c = load_model("tiny"), load_model("tiny"), load_model("tiny", seed=1)
    assert model_fingerprint(a) == model_fingerprint(b) != model_fingerprint(c)
    assert weights_digest(a) == weights_digest(b) != weights_digest(c)
    assert model_meta(a)["architecture_fingerprint"] == model_meta(c)["architecture_fingerprint"]


def test_set_from_another_model_is_refused_by_erase_finetune_and_metrics(fresh):
    other = load_model("tiny", seed=1)
    ns = _located(other)
    with pytest.raises(ValueError, match=r"model_fingerprint.*weights or config differ.*across_models=True"):
        with ci.erase(fresh, ns):
            pass
    with pytest.raises(ValueError, match="weights or config differ"):
        ci.finetune(fresh, PROMPTS, neurons=ns, arms=("located",), epochs=1)
    with pytest.raises(ValueError, match="different models"):
        metrics.overlap(ns, _located(fresh))
    with ci.erase(fresh, ns, across_models=True):  # the explicit cross-checkpoint comparison
        pass
    assert metrics.overlap(ns, _located(fresh), across_models=True) == 1.0
    wide = load_model("tiny", d_mlp=96, seed=1)
    with pytest.raises(ValueError, match="96"), ci.erase(fresh, _located(wide), across_models=True):
        pass


def test_in_place_edit_invalidates_sets_and_checkpoints(fresh, tmp_path):
    ns = _located(fresh)
    ck = tmp_path / "dcsn.ckpt"
    ci.DCSN(fresh, progress=False, checkpoint=ck).fit(PROMPTS)
    from capinterp.interventions.neuron_params import zero_neurons

    zero_neurons(fresh, ns)  # an in-place edit of the weights
    with pytest.raises(ValueError, match="weights or config differ"), ci.erase(fresh, ns):
        pass
    with pytest.raises(ValueError, match="different computation"):
        ci.DCSN(fresh, progress=False, checkpoint=ck).fit(PROMPTS)


# ----------------------------------------------------------------------------- 3. inputs
@pytest.mark.parametrize(
    "bad, err, match",
    [
        ("1+1=", TypeError, "single str"),
        (b"1+1=", TypeError, "single bytes"),
        ({"prompt": "a", "target": "b"}, TypeError, "single dict"),
        ([("", "2")], ValueError, "item 0 has an empty prompt"),
        ([("1+1=", "2"), {"prompt": "", "target": "x"}], ValueError, "item 1 has an empty prompt"),
        ([("1+1=", 2)], TypeError, "item 0"),
        ([{"prompt": None, "target": "x"}], TypeError, "item 0"),
        ([], ValueError, "empty dataset"),
        (42, TypeError, "int"),
    ],
)
def test_bad_data_is_refused_at_the_door(tiny, bad, err, match):
    for loc in (ci.DCSN(tiny, progress=False), ci.CNL(tiny, steps=2, progress=False)):
        with pytest.raises(err, match=match):
            loc.fit(bad)
    with pytest.raises(err, match=match):
        ci.evaluate(tiny, bad)


def test_dataframe_is_read_by_columns(tiny):
    df = pd.DataFrame({"prompt": [p for p, _ in PROMPTS], "target": [t for _, t in PROMPTS], "op": ["+"] * 4})
    a = ci.DCSN(tiny, progress=False).fit(df).scores_.scores
    b = ci.DCSN(tiny, progress=False).fit(PROMPTS).scores_.scores
    assert torch.equal(a, b)
    assert ci.core.example.as_examples(df)[0].meta == {"op": "+"}
    with pytest.raises(ValueError, match="'prompt' column"):
        ci.DCSN(tiny, progress=False).fit(pd.DataFrame({"text": ["a"]}))


@pytest.mark.parametrize(
    "make",
    [
        lambda m: ci.CNL(m, sigma=float("inf")),
        lambda m: ci.CNL(m, steps=True),
        lambda m: ci.CNL(m, batch_size=2.5),
        lambda m: ci.DCSN(m, sigma=float("nan")),
        lambda m: ci.KN(m, threshold=float("nan")),
        lambda m: ci.KnowledgeCircuit(m, noise=float("nan")),
        lambda m: ci.KnowledgeCircuit(m, acdc_threshold=float("nan")),
        lambda m: ci.KnowledgeCircuit(m, steps="30"),
        lambda m: ci.CausalTrace(m, samples=2.0),
        lambda m: ci.CausalTrace(m, noise_std=float("inf")),
        lambda m: ci.QueryLocalization(m, tau=float("nan")),
    ],
)
def test_bad_hyper_parameters_name_the_argument(tiny, make):
    with pytest.raises((ValueError, TypeError)) as info:
        make(tiny)
    assert "must be" in str(info.value) and "got" in str(info.value)


@pytest.mark.parametrize("factor", [float("nan"), float("inf"), "2", None, True])
def test_scale_factor_checked(tiny, factor):
    ns = _located(tiny)
    with pytest.raises((ValueError, TypeError), match="factor"), ci.scale(tiny, ns, factor):
        pass


# ----------------------------------------------------------------------------- 4. files
def test_flipped_byte_is_detected(tmp_path):
    p = tmp_path / "s.capi"
    NeuronScores(torch.linspace(0, 1, 12).view(3, 4)).save(p)
    raw = bytearray(p.read_bytes())
    raw[-5] ^= 0x01  # inside the tensor data (safetensors puts data after the header)
    p.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match="checksum"):
        NeuronScores.load(p)


def _rewrite_header(p, **changes):
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(p), framework="pt") as f:
        hdr = json.loads(f.metadata()["capinterp"])
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open is not iterable)
    hdr.update(changes)
    save_file(tensors, str(p), metadata={"capinterp": json.dumps(hdr)})


@pytest.mark.parametrize(
    "changes",
    [
        {"format_version": 0},
        {"format_version": True},
        {"format_version": "2"},
        {"format_version": 4},  # newer than this capinterp reads
        {"meta": [1, 2]},
        {"shape": [3, True]},
        {"shape": "3x4"},
        {"checksum": "0" * 64},
    ],
)
def test_nonsense_headers_are_refused(tmp_path, changes):
    p = tmp_path / "s.capi"
    NeuronScores(torch.zeros(3, 4)).save(p)
    _rewrite_header(p, **changes)
    with pytest.raises(ValueError):
        NeuronScores.load(p)


def test_saving_never_replaces_by_accident(tmp_path):
    scores = NeuronScores(torch.zeros(2, 3))
    ns = scores.top_k(1)
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="not a capinterp file"):
        scores.save(tmp_path / "notes.txt")
    assert (tmp_path / "notes.txt").read_text() == "mine"
    scores.save(tmp_path / "a.capi")
    scores.save(tmp_path / "a.capi")  # the same kind: replacing is the point
    with pytest.raises(ValueError, match="saved NeuronScores"):
        ns.save(tmp_path / "a.capi")
    with pytest.raises(ValueError, match="existing folder with other files"):
        scores.save(tmp_path)
    ns.save(tmp_path / "a.capi", overwrite=True)
    assert isinstance(ci.units.neurons.load(tmp_path / "a.capi"), NeuronSet)
    (tmp_path / "empty").mkdir()
    scores.save(tmp_path / "empty")  # an empty folder is fine
    assert ci.units.neurons.load(tmp_path / "empty") is not None


def test_checkpoint_naming_missing_examples_is_refused(tiny, tmp_path):
    from capinterp.kernels.accumulate import ScoreSum

    ck = tmp_path / "c.ckpt"
    ci.DCSN(tiny, progress=False, checkpoint=ck).fit(PROMPTS)
    acc = ScoreSum.load(ck)
    acc.done.add(17)
    acc.save(ck)
    with pytest.raises(ValueError, match=r"marks examples \[17\]"):
        ci.DCSN(tiny, progress=False, checkpoint=ck).fit(PROMPTS)


# ----------------------------------------------------------------------------- 5. CLI
@pytest.mark.parametrize(
    "argv, match",
    [
        (["info", "--model", "tiny", "--device", "cuda:7"], "--device"),
        (["info", "--model", "tiny", "--device", "banana"], "--device"),
        (["localize", "--model", "tiny", "--out", "FILE"], "existing file"),
        (["reproduce", "--model", "tiny", "--only", " , "], "--only"),
        (["evaluate", "--model", "tiny", "--batch-size", "0"], "--batch-size"),
    ],
)
def test_cli_errors_are_one_line_before_loading(argv, match, tmp_path, monkeypatch, capsys):
    import capinterp.arch.model as model_mod

    monkeypatch.setattr(model_mod, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    (tmp_path / "FILE").write_text("x")
    argv = [str(tmp_path / a) if a == "FILE" else a for a in argv]
    assert cli(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("capinterp: error:") and "\n" not in err and match in err


@pytest.mark.parametrize(
    "call",
    [
        lambda: ci.CNL("smollm2").fit(PROMPTS),  # constructors store; fit checks the model before work
        lambda: ci.DCSN(None).fit(PROMPTS),
        lambda: ci.evaluate("tiny", PROMPTS),
        lambda: ci.finetune(object(), PROMPTS),
        lambda: ci.QueryLocalization(42).fit([[("1+1=", "2"), ("0+2=", "2")]]),
    ],
)
def test_a_non_model_is_a_type_error_naming_it(call):
    with pytest.raises(TypeError, match="model must be a model from capinterp.load_model"):
        call()


def test_temporary_edit_keeps_identity_and_permanent_edit_changes_it(fresh):
    from capinterp.interventions.editing import KnowledgeEdit

    ns = _located(fresh, 2)
    layer, idx = next(iter(ns))
    rows = torch.ones(1, fresh.cfg.d_model)
    edit = KnowledgeEdit("kn", "erase", ns, {layer: (torch.tensor([idx]), rows)}, old_target="2")
    before = model_fingerprint(fresh)
    with edit.apply(fresh):
        inside = model_fingerprint(fresh)
    assert inside != before and model_fingerprint(fresh) == before
    refresh_fingerprint(fresh)
    assert model_fingerprint(fresh) == before  # the kept digest is the true one
    edit.apply_permanently(fresh)
    assert model_fingerprint(fresh) != before


@pytest.mark.slow
def test_smollm2_fingerprint_is_weight_aware_and_cached(smollm2):
    before = model_fingerprint(smollm2)
    refresh_fingerprint(smollm2)
    assert model_fingerprint(smollm2) == before  # deterministic recompute
    w = smollm2.blocks[10].mlp.out.original_component.weight
    with torch.no_grad():
        old = w[100, 200].clone()
        w[100, 200] = old + 1e-4
        changed = model_fingerprint(smollm2)
        w[100, 200] = old
    assert changed != before and model_fingerprint(smollm2) == before


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda s: s.select(sigma=float("inf")), "sigma"),
        (lambda s: s.top_k(2.5), "k must be"),
        (lambda s: s.top_k(True), "k must be"),
        (lambda s: s.threshold(float("nan")), "t must be"),
        (lambda s: s.top_k(3).random_like("a"), "seed"),
        (lambda s: s.to_frame(top=-1), "top"),
    ],
)
def test_selection_rules_check_their_arguments(call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        call(NeuronScores(torch.randn(3, 8)))
