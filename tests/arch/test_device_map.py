"""``load_model(folder, device_map=...)``: accelerate's placement, with CPU-only maps here (a
map over several GPUs needs GPUs: not tested in CI). A map with a module offloaded to disk makes
accelerate dispatch the model with hooks that move activations and weights per call, the same
route a multi-GPU map takes; integrated gradients through it equal the plain model's."""

import pytest
import torch

from capinterp.arch.model import load_model
from capinterp.arch.tiny import tiny_llama_hf
from capinterp.data import arithmetic
from capinterp.localizers.cnl import CNL
from capinterp.localizers.dcsn import DCSN


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny_hf")
    hf, tok = tiny_llama_hf()
    hf.save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def ds():
    return arithmetic(ops="+", n=3, seed=0)


def _map_with_disk(*on_disk: str) -> dict:
    """The tiny Llama's modules on the CPU, except ``on_disk``."""
    modules = [
        "model.embed_tokens",
        *(f"model.layers.{i}" for i in range(4)),
        "model.norm",
        "model.rotary_emb",
        "lm_head",
    ]
    return {m: "disk" if m in on_disk else "cpu" for m in modules}


def test_device_map_auto_on_cpu_gives_the_same_scores(folder, ds):
    plain = load_model(folder, threads=1)
    placed = load_model(folder, device_map="auto", max_memory={"cpu": "2GiB"}, threads=1)
    assert placed.capinterp_device_map == "auto"
    torch.testing.assert_close(
        DCSN(placed, progress=False).fit(ds).scores_[:], DCSN(plain, progress=False).fit(ds).scores_[:]
    )
    with pytest.raises(ValueError, match="device_map"):
        DCSN(placed, device="cpu", progress=False).fit(ds)  # moving would undo the placement: refused in fit


def test_dispatched_model_with_disk_offload(folder, ds, tmp_path):
    plain = load_model(folder, threads=1)
    placed = load_model(folder, device_map=_map_with_disk("model.layers.3"), offload_folder=tmp_path, threads=1)
    assert placed.original_model.hf_device_map["model.layers.3"] == "disk"
    a = CNL(plain, steps=4, progress=False).fit(ds).scores_[:]
    b = CNL(placed, steps=4, progress=False).fit(ds).scores_[:]
    torch.testing.assert_close(a, b)


@pytest.mark.parametrize("norms", ["raw", "fold"])
def test_dcsn_reads_weights_offloaded_to_disk(folder, ds, tmp_path, norms):
    """DCSN reads W_out, W_U and the norm gains directly; offloaded, they are meta between calls."""
    plain = load_model(folder, threads=1)
    dm = _map_with_disk("model.layers.3", "model.norm", "lm_head")
    placed = load_model(folder, device_map=dm, offload_folder=tmp_path, threads=1)
    a = DCSN(plain, norms=norms, progress=False).fit(ds).scores_[:]
    b = DCSN(placed, norms=norms, progress=False).fit(ds).scores_[:]
    assert a.abs().max() > 0
    torch.testing.assert_close(a, b)
    assert placed.blocks[3].mlp.original_component.down_proj.weight.device.type == "meta"  # put back


def test_device_map_arguments_are_checked_first(folder):
    with pytest.raises(ValueError, match="not 'tiny'"):
        load_model("tiny", device_map="auto")
    with pytest.raises(ValueError, match="not available|does not exist"):
        load_model(folder, device_map={"": "cuda:3"})
    with pytest.raises(TypeError, match="device_map must be a string or a dict"):
        load_model(folder, device_map=3)
