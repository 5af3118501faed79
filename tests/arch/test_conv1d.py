"""transformers' Conv1D layout, known in one place (capinterp.arch.linear.is_conv1d / linear_layout)."""

from __future__ import annotations

import torch
from transformers.pytorch_utils import Conv1D

from capinterp.arch.linear import is_conv1d, linear_layout


def test_conv1d_is_read_as_linear_through_a_view():
    """A Conv1D's weight [in, out] comes back as nn.Linear's [out, in]: it computes the module's output, and
    writes through it reach the module."""
    torch.manual_seed(0)
    conv = Conv1D(nf=5, nx=3)
    x = torch.randn(2, 3)
    assert is_conv1d(conv)
    w = linear_layout(conv)
    assert w.shape == (5, 3) and torch.allclose(x @ w.T + conv.bias, conv(x))
    with torch.no_grad():
        w[4, 2] = 7.0
    assert conv.weight[2, 4] == 7.0
    clone = conv.weight.detach().clone()  # a weight stored as the module stores its own
    assert torch.equal(linear_layout(conv, clone), clone.T)


def test_linear_and_lookalikes_are_not_conv1d():
    """nn.Linear keeps its weight; a module whose ``nf`` does not match its weight, or one named Conv1D
    without the attributes, is no Conv1D (read from the attributes, not the class name)."""
    lin = torch.nn.Linear(3, 5)
    assert not is_conv1d(lin) and linear_layout(lin) is lin.weight

    class Conv1D(torch.nn.Module):  # the name alone must not decide
        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.zeros(3, 5))

    odd = Conv1D()
    assert not is_conv1d(odd) and linear_layout(odd) is odd.weight
    odd.nf, odd.nx = 4, 3  # outputs that do not match the weight
    assert not is_conv1d(odd)
    odd.nf = 5
    assert is_conv1d(odd)
