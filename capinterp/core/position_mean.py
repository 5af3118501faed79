"""Mean activations for mean ablation, the first position apart from the rest.

A causal model's first position is its attention sink: whatever the token, some activations there
are far larger than anywhere else (SmolLM2 135M: FFN neuron 1229 of layer 11 averages about 2,800
at the first position of known facts, and about 0 on the tokens after it). A mean over every
position writes a share of that value into every token, and ablating a neuron to such a mean is
no ablation at all but an intervention far outside what the model ever sees: mean-ablating the
5 % of neurons with the smallest attributions then destroys the answer
(``scripts/sink_ablation.py`` measures it). So mean ablation here takes two means over the
reference data's real (unpadded) tokens: one over first positions, one over all later positions,
each used at its own kind of position (:func:`at_positions`). With a BOS token the first mean is
the BOS activation itself, so ablation leaves that position unchanged.
"""

from __future__ import annotations

import torch

__all__ = ["SplitMean", "at_positions", "batch_rows"]


class SplitMean:
    """Running sums of ``[B, T, *shape]`` values over real tokens, first positions apart."""

    def __init__(self) -> None:
        self._sums: list[torch.Tensor] = []  # first positions, later positions
        self._counts: list[torch.Tensor] = []

    def add(self, values: torch.Tensor, lengths: torch.Tensor, takes_part: torch.Tensor | None = None) -> None:
        """``values`` ``[B, T, ...]``; ``lengths`` ``[B]``: how many leading positions are real;
        ``takes_part`` (bool, ``values``' shape): which entries count (default: all of a real token's;
        an expert's neurons count only on the tokens routed to it)."""
        v = values.double()
        real = (torch.arange(v.shape[1], device=v.device)[None] < lengths.to(v.device)[:, None]).double()
        w = real.reshape(*real.shape, *([1] * (v.dim() - 2))).expand_as(v)
        if takes_part is not None:
            w = w * takes_part.to(v.device).double()
        sums = [(v[:, :1] * w[:, :1]).sum((0, 1)), (v[:, 1:] * w[:, 1:]).sum((0, 1))]
        counts = [w[:, :1].sum((0, 1)), w[:, 1:].sum((0, 1))]
        if not self._sums:
            self._sums, self._counts = sums, counts
        else:
            self._sums = [a + b for a, b in zip(self._sums, sums)]
            self._counts = [a + b for a, b in zip(self._counts, counts)]

    def result(self) -> torch.Tensor:
        """``[2, *shape]`` float32: the first-position mean, then the later positions' mean; an
        entry that never counted at later positions takes its first-position mean, one never
        counted at all 0."""
        if not self._sums or not float(self._counts[0].max() if self._counts[0].numel() else 0):
            raise ValueError("a mean over the reference data needs at least one token")
        first = self._sums[0] / self._counts[0].clamp_min(1)
        rest = torch.where(self._counts[1] > 0, self._sums[1] / self._counts[1].clamp_min(1), first)
        return torch.stack([first, rest]).float()


def at_positions(means: torch.Tensor, T: int) -> torch.Tensor:
    """``[T, *shape]`` from :meth:`SplitMean.result`: the first mean at position 0, the other after."""
    idx = torch.ones(T, dtype=torch.long, device=means.device)
    idx[:1] = 0
    return means[idx]


def batch_rows(means: torch.Tensor, batch: int, T: int) -> torch.Tensor:
    """``[batch, T, *shape]``: :func:`at_positions` for every row of a batch (a view, no copy)."""
    rows = at_positions(means, T)
    return rows[None].expand(batch, *rows.shape)
