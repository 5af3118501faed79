import pytest
import torch

import capinterp as ci
from capinterp.data import Example
from capinterp.localizers.dcsn import last_token_activations
from capinterp.tokens import encode
from planting import PLANTED, plant

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
