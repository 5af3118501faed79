import pytest
import torch
from planting import PLANTED, plant

import capinterp as ci
from capinterp.data import Example
from capinterp.units.neurons import NeuronSet

EXAMPLES = [Example(f"{a}+{b}=", "7") for a, b in [(3, 4), (5, 2), (1, 6), (2, 5)]]


def _set(model, pairs):
    return NeuronSet.from_indices(pairs, model.cfg.n_layers, model.cfg.d_mlp)


def test_erasing_nothing_changes_nothing(tiny):
    ids = tiny.to_tokens("3+4=")
    before = tiny(ids)
    with ci.erase(tiny, _set(tiny, [])):
        during = tiny(ids)
    torch.testing.assert_close(before, during, rtol=0, atol=0)


def test_erase_zeroes_activations_and_hooks_go_away(tiny):
    ids = tiny.to_tokens("3+4=")
    s = _set(tiny, [(1, 5), (1, 6), (3, 0)])
    with ci.erase(tiny, s):
        _, cache = tiny.run_with_cache(ids)
        assert cache["blocks.1.mlp.hook_post"][..., [5, 6]].abs().max() == 0
        assert cache["blocks.3.mlp.hook_post"][..., 0].abs().max() == 0
        assert cache["blocks.1.mlp.hook_post"][..., 7].abs().max() > 0
    _, cache = tiny.run_with_cache(ids)
    assert cache["blocks.1.mlp.hook_post"][..., 5].abs().max() > 0


def test_hooks_removed_after_exception(tiny):
    ids = tiny.to_tokens("3+4=")
    before = tiny(ids)
    with pytest.raises(RuntimeError), ci.scale(tiny, _set(tiny, [(0, 1)]), 5.0):
        raise RuntimeError("boom")
    torch.testing.assert_close(tiny(ids), before, rtol=0, atol=0)


def test_scale_multiplies(tiny):
    ids = tiny.to_tokens("3+4=")
    _, clean = tiny.run_with_cache(ids)
    with ci.amplify(tiny, _set(tiny, [(2, 9)])):
        _, amp = tiny.run_with_cache(ids)
    # layer 2 neuron 9 doubles; its own layer's other neurons are untouched
    torch.testing.assert_close(amp["blocks.2.mlp.hook_post"][..., 9], 2 * clean["blocks.2.mlp.hook_post"][..., 9])
    torch.testing.assert_close(amp["blocks.2.mlp.hook_post"][..., 10], clean["blocks.2.mlp.hook_post"][..., 10])


def test_erasing_planted_neurons_removes_capability():
    m = ci.load_model("tiny")
    plant(m, EXAMPLES)
    one = {"max_new_tokens": 1}  # the planted model's answer is its next token (it then says "7" again)
    base = ci.evaluate(m, EXAMPLES, **one)
    with ci.erase(m, _set(m, PLANTED)):
        erased = ci.evaluate(m, EXAMPLES, **one)
    rand = _set(m, PLANTED).random_like(seed=0)
    with ci.erase(m, rand):
        control = ci.evaluate(m, EXAMPLES, **one)
    assert base.accuracy == 1.0 and erased.accuracy == 0.0 and control.accuracy == 1.0
    assert erased.mean_prob < 0.1 * base.mean_prob


def test_neuron_set_from_another_model_is_refused(tiny):
    other = NeuronSet.from_indices([(0, 1)], 30, 1536)
    with pytest.raises(ValueError, match="30 layers x 1536"), ci.erase(tiny, other):
        pass
    fp = NeuronSet.from_indices([(0, 1)], 4, 128, meta={"model_fingerprint": "deadbeef"})
    with pytest.raises(ValueError, match="fingerprint"), ci.erase(tiny, fp):
        pass
