import pytest
import torch
from planting import PLANTED, plant

import capinterp as ci
from capinterp.core.tokens import encode
from capinterp.data import Example
from capinterp.localizers.dcsn import last_token_activations

EXAMPLES = [Example(f"{a}+{b}=", "7") for a, b in [(3, 4), (5, 2), (1, 6), (2, 5), (6, 1), (4, 3)]]


@pytest.fixture
def planted():
    m = ci.load_model("tiny")
    plant(m, EXAMPLES)
    return m


def test_dcsn_recovers_planted_neurons(planted):
    d = ci.DCSN(planted, sigma=6, progress=False).fit(EXAMPLES)
    assert set(d.neurons_) == set(PLANTED)
    top = d.scores_.top_k(3)
    assert set(top) == set(PLANTED)


def test_dcsn_random_model_has_no_planted_signal():
    m = ci.load_model("tiny")
    d = ci.DCSN(m, sigma=6, progress=False).fit(EXAMPLES)
    assert not set(PLANTED) <= set(d.scores_.top_k(10))


def test_dcsn_equals_hand_computation_with_raw_weights():
    m = ci.load_model("tiny", seed=1)
    d = ci.DCSN(m, sigma=3, progress=False).fit(EXAMPLES[:3])
    items = encode(m, EXAMPLES[:3])
    for layer, idx in [(0, 3), (2, 100), (3, 7)]:
        w_out_row = m.blocks[layer].mlp.out.original_component.weight[:, idx]  # HF down_proj column
        u = m.unembed.original_component.weight  # HF lm_head [V, d_model]
        by_hand = 0.0
        for it in items:
            _, cache = m.run_with_cache(torch.tensor([it.prompt_ids]))
            a = cache[f"blocks.{layer}.mlp.hook_post"][0, -1, idx]
            by_hand += float((a * (u[it.target_ids[0]] @ w_out_row)).detach())
        assert d.scores_.scores[layer, idx].item() == pytest.approx(by_hand / 3, rel=1e-4, abs=1e-7)


def test_last_token_activations_respect_padding(tiny):
    items = encode(tiny, [Example("3+4=", "7"), Example("12*3+1=", "37")])
    acts, _ = last_token_activations(tiny, items)
    for b, it in enumerate(items):
        _, cache = tiny.run_with_cache(torch.tensor([it.prompt_ids]))
        torch.testing.assert_close(acts[b, 2], cache["blocks.2.mlp.hook_post"][0, -1], atol=1e-5, rtol=1e-5)


def test_pred_target_and_bad_args(tiny):
    d = ci.DCSN(tiny, target="pred", sigma=6, progress=False).fit(EXAMPLES)
    assert d.scores_.meta["params"]["target"] == "pred"
    with pytest.raises(ValueError, match="sigma must be > 0"):
        ci.DCSN(tiny, sigma=0)
    with pytest.raises(ValueError, match="target must be"):
        ci.DCSN(tiny, target="x")
    with pytest.raises(ValueError, match="empty dataset"):
        ci.DCSN(tiny).fit([])
    with pytest.raises(ValueError, match="batch_size"):
        ci.DCSN(tiny, batch_size=0)


def test_dcsn_scores_record_metadata(tiny):
    d = ci.DCSN(tiny, progress=False).fit(ci.data.arithmetic(ops="+", n=6))
    meta = d.scores_.meta
    assert meta["method"] == "dcsn" and meta["n_samples"] == 6 and meta["model"] == "tiny"
    assert meta["dataset"].startswith("arithmetic") and meta["model_fingerprint"]
    assert ci.localizers.get("DCSN") is ci.DCSN
    with pytest.raises(ValueError, match="unknown localizer 'nope'"):
        ci.localizers.get("nope")


def test_split_half_reports_overlap(planted):
    res = ci.DCSN(planted, progress=False).split_half(EXAMPLES * 2, seed=0)
    assert res["overlap"] == 1.0 and res["iou"] == 1.0 and res["n_a"] == 3
    assert res["ratio"] == pytest.approx(3 / (4 * 128))


@torch.no_grad()
def _folded_by_hand(m, examples, layer, idx):
    """Direct effect of neuron (layer, idx) on the first target token, through the model's own norm
    modules with their scales frozen: norm(v) * rms(v) / s == v * g / s for an RMSNorm."""

    def through(norm, v, scale):
        hf = norm.original_component
        rms = (v.pow(2).mean() + getattr(hf, "variance_epsilon", getattr(hf, "eps", None))).sqrt()
        return norm(v[None, None])[0, 0] * rms / scale

    total = 0.0
    for it in encode(m, examples):
        _, cache = m.run_with_cache(torch.tensor([it.prompt_ids], device=m.cfg.device))
        v = cache[f"blocks.{layer}.mlp.hook_post"][0, -1, idx] * m.blocks[layer].mlp.W_out[idx]
        if hasattr(m.blocks[layer], "ln2_post"):
            v = through(m.blocks[layer].ln2_post, v, cache[f"blocks.{layer}.ln2_post.hook_scale"][0, -1, 0])
        v = through(m.ln_final, v, cache["ln_final.hook_scale"][0, -1, 0])
        total += float(v @ m.W_U[:, it.target_ids[0]])
    return total / len(examples)


def test_folded_norms_equal_the_direct_effect_through_the_final_norm():
    m = ci.load_model("tiny", seed=1)
    d = ci.DCSN(m, sigma=3, norms="fold", progress=False).fit(EXAMPLES[:3])
    for layer, idx in [(0, 3), (2, 100), (3, 7)]:
        want = _folded_by_hand(m, EXAMPLES[:3], layer, idx)
        assert d.scores_.scores[layer, idx].item() == pytest.approx(want, rel=1e-4, abs=1e-7)
    assert d.scores_.meta["params"]["norms"] == "fold"
    with pytest.raises(ValueError, match="norms must be one of raw, fold"):
        ci.DCSN(m, norms="post")
    with pytest.raises(ValueError, match="needs an RMSNorm model"):
        ci.DCSN(ci.load_model("tiny-native"), norms="fold", progress=False).fit(EXAMPLES[:1])


@pytest.mark.slow
def test_folded_norms_on_gemma_include_the_post_ffn_norm(gemma3):
    gemma = gemma3
    exs = [Example(f"{a}+{b}=", str(a + b)) for a, b in [(3, 4), (2, 5), (1, 1)]]
    d = ci.DCSN(gemma, sigma=6, norms="fold", progress=False).fit(exs)
    raw = ci.DCSN(gemma, sigma=6, progress=False).fit(exs)
    for layer, idx in [(0, 5), (9, 1000), (17, 2047)]:
        want = _folded_by_hand(gemma, exs, layer, idx)
        assert d.scores_.scores[layer, idx].item() == pytest.approx(want, rel=1e-3, abs=1e-6)
    layer0 = lambda s: sum(1 for l, _ in s.neurons_ if l == 0) / max(1, len(s.neurons_))  # noqa: E731
    assert layer0(d) < layer0(raw)  # folding removes the raw projection's layer-0 bias
