"""A running top-k of activating token positions per unit, with each position's window of values.

The buffers are fixed: ``[n, k]`` values, text indices and positions, and ``[n, k, 2 * window + 1]``
activations around each kept position (NaN outside the text), whatever the corpus size. Each
batch's own top-k per unit (``torch.topk`` over its real tokens) is merged with the buffers by a
second ``torch.topk``; under torchrun the ranks' buffers are gathered and merged the same way.
"""

from __future__ import annotations

import math

import torch

from capinterp.core import distributed as dist

__all__ = ["RunningTopK"]


class RunningTopK:
    """The ``k`` highest activations of each of ``n`` units seen so far, with where and around."""

    def __init__(self, n: int, k: int, window: int, device: torch.device | str = "cpu") -> None:
        self.k, self.window = k, window
        self.values = torch.full((n, k), -math.inf, dtype=torch.float32, device=device)
        self.text = torch.full((n, k), -1, dtype=torch.long, device=device)
        self.position = torch.full((n, k), -1, dtype=torch.long, device=device)
        self.around = torch.full((n, k, 2 * window + 1), math.nan, dtype=torch.float32, device=device)

    def add(self, acts: torch.Tensor, real: torch.Tensor, text_index: torch.Tensor) -> None:
        """``acts`` ``[B, T, n]`` float32; ``real`` ``[B, T]`` bool (False at padding); ``text_index`` ``[B]``."""
        B, T, n = acts.shape
        flat = acts.masked_fill(~real[..., None], -math.inf).permute(2, 0, 1).reshape(n, B * T)
        vals, where = flat.topk(min(self.k, B * T), dim=1)
        row, pos = where // T, where % T
        offsets = torch.arange(-self.window, self.window + 1, device=acts.device)
        at = pos[..., None] + offsets  # [n, kk, 2w+1]
        inside = (at >= 0) & (at < T)
        idx = (row[..., None] * T + at.clamp(0, T - 1)).reshape(n, -1)
        around = flat.gather(1, idx).view(*at.shape)
        around = torch.where(inside & torch.isfinite(around), around, math.nan)
        self._merge(vals, text_index.to(acts.device)[row], pos, around)

    def _merge(self, vals: torch.Tensor, text: torch.Tensor, pos: torch.Tensor, around: torch.Tensor) -> None:
        allv = torch.cat([self.values, vals], 1)
        top, pick = allv.topk(self.k, dim=1)
        self.values = top
        self.text = torch.cat([self.text, text], 1).gather(1, pick)
        self.position = torch.cat([self.position, pos], 1).gather(1, pick)
        w = self.around.shape[-1]
        self.around = torch.cat([self.around, around], 1).gather(1, pick[..., None].expand(-1, -1, w))

    def merge_ranks(self) -> None:
        """Every rank's buffers merged (all-gather): each rank then holds the overall top-k."""
        if not dist.active():
            return
        dev = self.values.device
        mine = (self.values.cpu(), self.text.cpu(), self.position.cpu(), self.around.cpu())
        parts = dist.gather(mine)
        self.values = torch.full_like(self.values, -math.inf)
        self.text = torch.full_like(self.text, -1)
        self.position = torch.full_like(self.position, -1)
        self.around = torch.full_like(self.around, math.nan)
        for v, t, p, a in parts:
            self._merge(v.to(dev), t.to(dev), p.to(dev), a.to(dev))

    def kept(self, j: int) -> list[tuple[float, int, int, list[float]]]:
        """Unit ``j``'s entries ``(value, text, position, window values)``: highest value first, ties by
        text then position (the same order on one process and under torchrun); unfilled slots left out."""
        rows = zip(self.values[j].tolist(), self.text[j].tolist(), self.position[j].tolist(), self.around[j].tolist())
        out = [(v, t, p, a) for v, t, p, a in rows if t >= 0 and math.isfinite(v)]
        return sorted(out, key=lambda e: (-e[0], e[1], e[2]))
