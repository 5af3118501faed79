"""Running activation statistics per unit, in bounded memory, mergeable over torchrun ranks.

Exact: the count, mean and standard deviation (float64 sums of the values and their squares),
the minimum, the maximum and the share of positive values.

Quantiles come from a fixed histogram of :data:`FINE_BINS` bins that are uniform in
``asinh(x / SCALE)``: one set of bins for every unit and every rank (so ranks merge by adding
counts, with no range to agree on), fine near zero and relatively fine far from it. A quantile
is read by linear interpolation inside its bin (in the asinh space) and clipped to the exact
``[min, max]``; it lies in the same bin as the true quantile, so its error is at most that bin's
width: ``|error| <= H * e^H * (|x| + SCALE)`` with ``H = 2 * asinh(LIMIT / SCALE) / FINE_BINS``
(about 0.83% of ``|x| + 0.001``). Values beyond ``+-LIMIT`` fall in the end bins (their
quantiles are then clipped to the exact extremes, not interpolated).

The histogram shown on a card (:func:`display_histogram`) has :data:`DISPLAY_BINS` equal bins
between the exact minimum and maximum; each fine bin's count is spread over the display bins its
span overlaps, in proportion to the overlap, so a display count lies between the number of values
whose fine bin sits wholly inside the display bin and the number whose fine bin touches it; the
counts add up to the exact total.
"""

from __future__ import annotations

import math

import torch

from capinterp.core import distributed as dist

__all__ = ["DISPLAY_BINS", "FINE_BINS", "LIMIT", "QUANTILES", "SCALE", "RunningStats", "display_histogram"]

#: Fine bins of the quantile histogram.
FINE_BINS = 4096
#: Where the bins stop being near-linear: ``asinh(x / SCALE)``.
SCALE = 1e-3
#: Values beyond +-LIMIT share the end bins.
LIMIT = 1e4
#: The quantiles every card reports.
QUANTILES = (0.5, 0.9, 0.99, 0.999)
#: Equal bins of the histogram a card shows.
DISPLAY_BINS = 40

_SPAN = math.asinh(LIMIT / SCALE)
_WIDTH = 2 * _SPAN / FINE_BINS  # one fine bin in asinh units


class RunningStats:
    """Count, sums, extremes and the fine histogram of ``n`` units' values, added batch by batch."""

    def __init__(self, n: int, device: torch.device | str = "cpu") -> None:
        self.count = torch.zeros(n, dtype=torch.float64, device=device)
        self.total = torch.zeros(n, dtype=torch.float64, device=device)
        self.squares = torch.zeros(n, dtype=torch.float64, device=device)
        self.positive = torch.zeros(n, dtype=torch.float64, device=device)
        self.low = torch.full((n,), math.inf, dtype=torch.float32, device=device)
        self.high = torch.full((n,), -math.inf, dtype=torch.float32, device=device)
        self.hist = torch.zeros(n, FINE_BINS, dtype=torch.long, device=device)

    def add(self, values: torch.Tensor) -> None:
        """``values``: ``[tokens, n]`` float32, every row a real (unpadded) token."""
        if values.shape[0] == 0:
            return
        n = values.shape[1]
        v64 = values.double()
        self.count += values.shape[0]
        self.total += v64.sum(0)
        self.squares += v64.square().sum(0)
        self.positive += (values > 0).sum(0)
        self.low = torch.minimum(self.low, values.amin(0))
        self.high = torch.maximum(self.high, values.amax(0))
        bins = fine_bin(values) + torch.arange(n, device=values.device) * FINE_BINS
        self.hist += torch.bincount(bins.flatten(), minlength=n * FINE_BINS).view(n, FINE_BINS)

    def merge_ranks(self) -> None:
        """Every rank's counts, sums and histogram added (float64 all-reduce), extremes over ranks."""
        if not dist.active():
            return
        dev = self.count.device
        for name in ("count", "total", "squares", "positive"):
            setattr(self, name, dist.all_reduce_sum(getattr(self, name), dev))
        self.hist = dist.all_reduce_sum(self.hist.double(), dev).round().long()
        parts = dist.gather((self.low.cpu(), self.high.cpu()))
        self.low = torch.stack([p[0] for p in parts]).amin(0).to(dev)
        self.high = torch.stack([p[1] for p in parts]).amax(0).to(dev)

    def summary(self, j: int) -> dict:
        """Unit ``j``'s numbers: the fields of :class:`capinterp.cards.contexts.ActivationStats`."""
        n = float(self.count[j])
        mean = float(self.total[j]) / n
        var = max(float(self.squares[j]) / n - mean * mean, 0.0)
        low, high = float(self.low[j]), float(self.high[j])
        hist = self.hist[j].double().cpu()
        return dict(
            count=int(n),
            mean=mean,
            std=math.sqrt(var),
            max=high,
            min=low,
            quantiles={q: quantile(hist, q, low, high) for q in QUANTILES},
            frac_positive=float(self.positive[j]) / n,
            histogram=display_histogram(hist, low, high),
        )


def fine_bin(values: torch.Tensor) -> torch.Tensor:
    """The fine bin of each value (long, same shape)."""
    u = torch.asinh(values.double() / SCALE)
    return ((u + _SPAN) / _WIDTH).floor().clamp(0, FINE_BINS - 1).long()


def _value(u: torch.Tensor | float) -> torch.Tensor:
    return SCALE * torch.sinh(torch.as_tensor(u, dtype=torch.float64))


def quantile(hist: torch.Tensor, q: float, low: float, high: float) -> float:
    """The ``q`` quantile read off one unit's fine histogram (float64 counts), within ``[low, high]``."""
    total = float(hist.sum())
    cum = hist.cumsum(0)
    rank = q * total
    b = int(torch.searchsorted(cum, torch.tensor([rank], dtype=torch.float64))[0].clamp(max=FINE_BINS - 1))
    before = float(cum[b - 1]) if b > 0 else 0.0
    inside = float(hist[b])
    frac = (rank - before) / inside if inside > 0 else 0.5
    u = -_SPAN + (b + min(max(frac, 0.0), 1.0)) * _WIDTH
    return min(max(float(_value(u)), low), high)


def display_histogram(hist: torch.Tensor, low: float, high: float) -> tuple[tuple[float, ...], tuple[int, ...]]:
    """``(edges, counts)``: :data:`DISPLAY_BINS` equal bins on ``[low, high]`` (one bin when they are equal).

    Each fine bin's count is spread over the display bins its ``[low, high]``-clipped span overlaps, in
    proportion to the overlap; the counts are rounded by largest remainder, so they add up exactly."""
    total = round(float(hist.sum()))
    if not high > low:
        return (low, high), (total,)
    edges = torch.linspace(low, high, DISPLAY_BINS + 1, dtype=torch.float64)
    used = hist.nonzero().flatten()
    counts = hist.double()[used]
    a = _value(-_SPAN + used.double() * _WIDTH).clamp(low, high)[:, None]
    b = _value(-_SPAN + (used.double() + 1) * _WIDTH).clamp(low, high)[:, None]
    overlap = (torch.minimum(b, edges[None, 1:]) - torch.maximum(a, edges[None, :-1])).clamp(min=0)
    point = (b - a).squeeze(1) <= 0  # a fine bin clipped to one point: all of it where that point is
    share = overlap / (b - a).clamp(min=1e-300)
    at = ((a.squeeze(1) - low) / (high - low) * DISPLAY_BINS).floor().clamp(0, DISPLAY_BINS - 1).long()
    share[point] = torch.nn.functional.one_hot(at[point], DISPLAY_BINS).double()
    spread = (share / share.sum(1, keepdim=True).clamp(min=1e-300) * counts[:, None]).sum(0)
    whole = spread.floor()
    left = total - int(whole.sum())
    if left > 0:
        whole[torch.argsort(spread - whole, descending=True)[:left]] += 1
    return tuple(float(e) for e in edges), tuple(int(c) for c in whole)
