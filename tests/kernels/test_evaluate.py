import pytest
from planting import plant

import capinterp as ci
from capinterp.core.tokens import encode
from capinterp.data import Example
from capinterp.kernels.evaluate import greedy_continuations


def test_empty_dataset_is_an_error(tiny):
    with pytest.raises(ValueError, match="empty dataset"):
        ci.evaluate(tiny, [])


def test_greedy_matches_one_at_a_time(tiny):
    items = encode(tiny, [Example("3+4=", "7"), Example("12*3+1=", "37"), Example("9-", "1")])
    batched, _ = greedy_continuations(tiny, [i.prompt_ids for i in items], 3)
    for it, got in zip(items, batched):
        single, _ = greedy_continuations(tiny, [it.prompt_ids], 3)
        assert single[0] == got


def test_evaluate_on_planted_model_and_batch_size_invariance():
    ex = [Example(f"{a}+{b}=", "7") for a, b in [(3, 4), (5, 2), (1, 6)]]
    m = ci.load_model("tiny")
    r0 = ci.evaluate(m, ex)
    plant(m, ex)
    # the planted model writes "7" after every prompt, so its two-token continuation is "77", which
    # does not answer "7" (whole answers); one new token is its answer
    assert ci.evaluate(m, ex).accuracy == 0
    r1 = ci.evaluate(m, ex, batch_size=1, max_new_tokens=1)
    r2 = ci.evaluate(m, ex, batch_size=3, max_new_tokens=1)
    assert r0.accuracy == 0 and r1.accuracy == 1.0
    assert r1.mean_prob == pytest.approx(r2.mean_prob, rel=1e-5)
    assert list(r1.frame.columns) == ["prompt_tail", "target", "generated", "correct", "prob", "token"]
    assert r1["accuracy"] == 1.0 and "accuracy 1.000" in str(r1)


@pytest.mark.parametrize("name", ["tiny", "tiny-native"])
def test_logits_at_equals_full_forward(name):
    import torch

    from capinterp.arch.forward import logits_at

    m = ci.load_model(name)
    ids = torch.tensor([[5, 6, 7, 8, 9], [9, 8, 7, 6, 5]])
    full = m(ids)
    with ci.erase(m, ci.NeuronSet.from_indices([(0, 1), (1, 3)], m.cfg.n_layers, m.cfg.d_mlp)):
        erased_full = m(ids)
        erased = logits_at(m, ids, torch.tensor([2, 4]))
    torch.testing.assert_close(logits_at(m, ids, torch.tensor([2, 4])), full[[0, 1], [2, 4]], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(erased, erased_full[[0, 1], [2, 4]], atol=1e-5, rtol=1e-5)
    assert not torch.allclose(erased, full[[0, 1], [2, 4]])
