"""neuron_means: every neuron's mean activation, the first position apart from the later ones,
against a loop over the examples one at a time (dense), and over routed tokens only (MoE)."""

from __future__ import annotations

import torch

from capinterp.arch.family import family_of
from capinterp.arch.model import neuron_hook, neuron_shape
from capinterp.core.tokens import encode
from capinterp.data import Example
from capinterp.interventions.faithfulness import neuron_means

TEXTS = [Example("1+2=", "3"), Example("The capital of France is", " Paris"), Example("Seven plus one is", " eight")]


@torch.no_grad()
def _loop_means(model, items, routed_only: bool) -> torch.Tensor:
    """``[2, L, d]`` by hand: each example alone (no padding), its first position into one sum and
    every later position into the other; with ``routed_only``, a neuron counts a token only where
    its expert (any of the expert's neurons non-zero) or the shared expert ran."""
    L, d = neuron_shape(model)
    moe = family_of(model).moe
    sums, counts = torch.zeros(2, L, d, dtype=torch.float64), torch.zeros(2, L, d, dtype=torch.float64)
    for it in items:
        _, cache = model.run_with_cache(torch.tensor([it.ids]))
        for l in range(L):
            act = cache[neuron_hook(l)][0].double()  # [T, d]
            ran = torch.ones_like(act, dtype=torch.bool)
            if routed_only:
                routed = moe.n_experts * moe.d_expert
                on = act[:, :routed].unflatten(-1, (moe.n_experts, moe.d_expert)).ne(0).any(-1)
                ran[:, :routed] = on.repeat_interleave(moe.d_expert, -1)
            for t in range(act.shape[0]):
                slot = 0 if t == 0 else 1
                sums[slot, l] += torch.where(ran[t], act[t], 0.0)
                counts[slot, l] += ran[t].double()
    return sums / counts


def test_dense_means_equal_a_loop_over_unpadded_examples(tiny):
    items = encode(tiny, TEXTS)
    assert len({len(it.ids) for it in items}) > 1  # batches of 2 pad: padding must not count
    got = neuron_means(tiny, items, batch_size=2)
    want = _loop_means(tiny, items, routed_only=False)
    assert got.shape == (2, *neuron_shape(tiny))
    assert torch.allclose(got.double(), want, atol=1e-5)
    assert not torch.allclose(got[0], got[1])  # the attention sink's mean is its own


def test_moe_means_count_only_the_tokens_routed_to_the_expert():
    from moe_tiny import load_tiny_moe

    model = load_tiny_moe("qwen2_moe")[0]
    items = encode(model, TEXTS)
    got = neuron_means(model, items, batch_size=2).double()
    want = _loop_means(model, items, routed_only=True)
    seen = want.isfinite()  # an expert no token reached has no mean to compare
    assert seen.any() and torch.allclose(got[seen], want[seen], atol=1e-5)
    # over all tokens instead, a rarely routed expert's mean would be pulled toward 0
    assert not torch.allclose(want[seen], _loop_means(model, items, routed_only=False)[seen], atol=1e-5)
