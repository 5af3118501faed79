"""Devices are checked before anything moves; bfloat16 models run every dataset method with
float32 scores close to the float32 model's (tiny model, CPU)."""

import pytest
import torch

from capinterp.arch.model import load_model, move_model
from capinterp.core.example import Example
from capinterp.core.settings import resolve_device, resolve_dtype
from capinterp.data import arithmetic
from capinterp.kernels.evaluate import evaluate
from capinterp.localizers.causal_trace import CausalTrace
from capinterp.localizers.cnl import CNL
from capinterp.localizers.dcsn import DCSN

BAD = ["cuda:7", "meta", "nonsense", "mps"] + (["cuda"] if not torch.cuda.is_available() else [])


@pytest.fixture(scope="module")
def tiny32():
    return load_model("tiny", threads=1)


@pytest.fixture(scope="module")
def tiny16():
    return load_model("tiny", dtype="bfloat16", threads=1)


@pytest.mark.parametrize("device", BAD)
def test_bad_device_is_refused_and_the_model_is_untouched(tiny32, device):
    before = {n: p.detach().clone() for n, p in tiny32.named_parameters()}
    cfg_device = tiny32.cfg.device
    for make in (
        lambda: CNL(tiny32, device=device),
        lambda: DCSN(tiny32, device=device),
        lambda: CausalTrace(tiny32, device=device),
        lambda: move_model(tiny32, device),
    ):
        with pytest.raises(ValueError, match="device"):
            make()
    assert tiny32.cfg.device == cfg_device
    for n, p in tiny32.named_parameters():
        assert p.device.type == "cpu" and torch.equal(p, before[n]), n
    ex = arithmetic(ops="+", n=2, seed=0)
    assert evaluate(tiny32, ex, progress=False).n == 2  # still usable


def test_load_model_checks_arguments_before_loading():
    with pytest.raises(ValueError, match="cuda:9|not available"):
        load_model("tiny", device="cuda:9")
    with pytest.raises(TypeError, match="device must be"):
        load_model("tiny", device=3)
    with pytest.raises(ValueError, match="dtype must be one of"):
        load_model("tiny", dtype="int8")
    with pytest.raises(ValueError, match="either device"):
        load_model("smollm2", device="cpu", device_map="auto")
    with pytest.raises(ValueError, match="max_memory and offload_folder only apply"):
        load_model("smollm2", max_memory={"cpu": "1GiB"})
    with pytest.raises(ValueError, match="device_map must be"):
        load_model("smollm2", device_map="everywhere")


def test_resolve_device_and_dtype():
    assert resolve_device(None) == torch.device("cpu")
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_dtype("bf16") is torch.bfloat16 and resolve_dtype(torch.float16) is torch.float16
    assert resolve_dtype(None) is None


def _top(scores: torch.Tensor, k: int) -> set[int]:
    return set(scores.abs().flatten().topk(k).indices.tolist())


def test_bfloat16_scores_are_float32_and_close_to_float32(tiny32, tiny16):
    assert next(tiny16.parameters()).dtype == torch.bfloat16
    ds = arithmetic(ops="+", n=4, seed=0)
    for make in (lambda m: CNL(m, steps=8, progress=False), lambda m: DCSN(m, progress=False)):
        s32, s16 = make(tiny32).fit(ds).scores_[:], make(tiny16).fit(ds).scores_[:]
        assert s16.dtype == torch.float32 and torch.isfinite(s16).all()
        rel = float((s16 - s32).abs().max() / s32.abs().max())
        assert rel < 0.1, rel  # bfloat16 keeps 8 bits of mantissa: errors of a few percent
        assert len(_top(s16, 20) & _top(s32, 20)) >= 14
    res = evaluate(tiny16, ds, progress=False)
    assert res.n == 4


def test_bfloat16_causal_trace_runs_and_agrees(tiny32, tiny16):
    facts = [
        Example("The Eiffel Tower is in the city of", "", {"target_from": "greedy", "subject": "Eiffel Tower"}),
        Example("Rome is the capital of", "", {"target_from": "greedy", "subject": "Rome"}),
    ]
    a = CausalTrace(tiny32, samples=3, kinds=("mlp",), progress=False).fit(facts)
    b = CausalTrace(tiny16, samples=3, kinds=("mlp",), progress=False).fit(facts)
    assert b.grids_["mlp"].dtype == torch.float32 and b.grids_["mlp"].shape == a.grids_["mlp"].shape
    assert float((a.grids_["mlp"] - b.grids_["mlp"]).nan_to_num().abs().max()) < 0.05


@pytest.mark.slow
def test_smollm2_bfloat16_scores_match_float32(smollm2, smollm2_bf16):
    """Half precision on a real model: the numbers docs/scale.md quotes come from benchmarks/bench_precision.py.
    The session's two copies of SmolLM2 (float32 and bfloat16): no load of its own."""
    assert next(smollm2.parameters()).dtype == torch.float32
    assert next(smollm2_bf16.parameters()).dtype == torch.bfloat16
    ds = arithmetic(ops="+", n=2, seed=0)
    got = {}
    for dtype, model in (("float32", smollm2), ("bfloat16", smollm2_bf16)):
        got[dtype] = [
            CNL(model, steps=4, progress=False).fit(ds).scores_[:],  # 4 steps: bf16 matmuls are slow on CPU
            DCSN(model, progress=False).fit(ds).scores_[:],
        ]
    for (a, b), (min_overlap, max_rel) in zip(zip(got["float32"], got["bfloat16"]), ((80, 0.3), (95, 0.1))):
        assert b.dtype == torch.float32
        assert len(_top(a, 100) & _top(b, 100)) >= min_overlap
        assert float((a - b).abs().max() / a.abs().max()) < max_rel
