"""The roofline's FLOP counter (``benchmarks/_roofline.py``) against a hand count on the tiny model."""

from __future__ import annotations

import os
import sys

import pytest

import capinterp as ci

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))

import _roofline as rf


@pytest.fixture(scope="module")
def tiny():
    return ci.load_model("tiny")


def test_dims_read_the_tiny_config(tiny):
    d = rf.Dims.of(tiny)
    assert (d.n_layers, d.d_model, d.d_mlp, d.n_heads, d.d_head, d.n_kv, d.d_vocab, d.gated) == (
        4, 64, 128, 4, 16, 2, 512, True,
    )  # fmt: skip


def test_block_params_equal_the_models_matmul_weights(tiny):
    """Q, K, V, O and the three FFN projections of layer 0, as stored in the model."""
    stored = sum(
        p.numel() for n, p in tiny.named_parameters() if p.dim() == 2 and (".layers.0." in n or "blocks.0." in n)
    )
    assert rf.Dims.of(tiny).block_matmul_params == stored


def test_forward_flops_equal_a_hand_count(tiny):
    d, T = rf.Dims.of(tiny), 5
    # per block: Q 64x64, K 64x32, V 64x32, O 64x64, gate/up/down 3 x 64x128 = 36864 weights
    weights = 64 * 64 + 64 * 32 + 64 * 32 + 64 * 64 + 3 * 64 * 128
    block = 2 * T * weights + 4 * T * T * (4 * 16)  # matmuls + scores and mix over T keys
    hand = 4 * block + 2 * T * 64 * 512  # four blocks + the unembedding at every position
    assert rf.forward_flops(d, T) == hand == 1827840
    assert rf.forward_flops(d, T, rows=3, unembed=0) == 3 * 4 * block
    assert rf.forward_flops(d, T, last=1, unembed=0) == 2 * block  # describe: stopped after layer 1
    # forward + activation-gradient backward: matmuls twice, attention's two products three times
    grad_block = 2 * (2 * T * weights) + 3 * (4 * T * T * (4 * 16))
    assert rf.forward_flops(d, T, grad=True) == 4 * grad_block + 2 * (2 * T * 64 * 512)


def test_ig_fast_route_counts_the_staircase(tiny):
    d, T = rf.Dims.of(tiny), 6
    # 2 rows per layer at layers 0 and 3, one answer position: blocks 4 and 1 over 1 query x 6 keys
    got = rf.ig_fast_flops(d, T, p0=5, n_pos=1, rows=4, layers=[0, 3])
    per_row = (4 + 1) / 2 * rf.block_flops(d, 1, T, grad=True) + 2 * (2 * 64 * 512)
    assert got == rf.forward_flops(d, T) + int(4 * per_row)


def test_matmul_gflops_is_positive_and_checks_its_input():
    assert rf.matmul_gflops(1, shape=(16, 32, 32), repeats=1) > 0
    with pytest.raises(ValueError, match="positive"):
        rf.matmul_gflops(0)


def test_forward_flops_equal_torchs_flop_counter(tiny):
    """An independent count: torch's own FLOP counter over the tiny model's actual forward."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    tokens = torch.randint(0, 512, (2, 7), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), FlopCounterMode(display=False) as fc:
        tiny(tokens)
    assert fc.get_total_flops() == rf.forward_flops(rf.Dims.of(tiny), 7, rows=2)
