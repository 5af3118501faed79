"""Mean activations for mean ablation, the first position apart from the rest.

A causal model's first position is its attention sink: whatever the token, some activations there
are far larger than anywhere else (SmolLM2 135M: FFN neuron 1229 of layer 11 reads 2,573 at the
first position of a known fact, and about 0 on the tokens after it). A mean over every position
writes a share of that value into every token, and ablating a neuron to such a mean is no
ablation at all: it is an intervention far outside what the model ever sees (on SmolLM2's facts,
mean-ablating the 5 % of neurons with the smallest attributions left p(target) at 0.0002 of 0.64;
with the first position averaged apart, 0.54). So mean ablation here takes two means over the
reference data's real (unpadded) tokens: one over first positions, one over all later positions,
each used at its own kind of position (:func:`at_positions`). With a BOS token the first mean is
the BOS activation itself, so ablation leaves that position unchanged.
"""

from __future__ import annotations

import torch

__all__ = ["SplitMean", "at_positions"]


class SplitMean:
    """Running sums of ``[B, T, *shape]`` values over real tokens, first positions apart."""

    def __init__(self) -> None:
        self._first: torch.Tensor | None = None
        self._rest: torch.Tensor | None = None
        self._n_first = 0
        self._n_rest = 0

    def add(self, values: torch.Tensor, lengths: torch.Tensor) -> None:
        """``values`` ``[B, T, ...]``; ``lengths`` ``[B]``: how many leading positions are real."""
        v = values.double()
        lengths = lengths.to(v.device)
        later = (torch.arange(1, v.shape[1], device=v.device)[None] < lengths[:, None]).double()  # [B, T-1]
        first = (lengths > 0).double()
        f = torch.einsum("b...,b->...", v[:, 0], first)
        r = torch.einsum("bt...,bt->...", v[:, 1:], later)
        self._first = f if self._first is None else self._first + f
        self._rest = r if self._rest is None else self._rest + r
        self._n_first += int(first.sum())
        self._n_rest += int(later.sum())

    def result(self) -> torch.Tensor:
        """``[2, *shape]`` float32: the first-position mean, then the later positions' mean (the
        first-position mean stands in where no prompt has a second token)."""
        if self._first is None or self._rest is None or not self._n_first:
            raise ValueError("a mean over the reference data needs at least one token")
        first = self._first / self._n_first
        rest = self._rest / self._n_rest if self._n_rest else first
        return torch.stack([first, rest]).float()


def at_positions(means: torch.Tensor, T: int) -> torch.Tensor:
    """``[T, *shape]`` from :meth:`SplitMean.result`: the first mean at position 0, the other after."""
    idx = torch.ones(T, dtype=torch.long, device=means.device)
    idx[:1] = 0
    return means[idx]
