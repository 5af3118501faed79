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

The histogram shown on a card (:func:`display_histograms`) has :data:`DISPLAY_BINS` equal bins
between the exact minimum and maximum; each fine bin's count is spread over the display bins its
span overlaps, in proportion to the overlap, so a display count lies between the number of values
whose fine bin sits wholly inside the display bin and the number whose fine bin touches it; the
counts add up to the exact total.
"""

from __future__ import annotations

import math

import torch

from capinterp.core import distributed as dist

__all__ = [
    "DISPLAY_BINS",
    "FINE_BINS",
    "LIMIT",
    "QUANTILES",
    "SCALE",
    "RunningStats",
    "display_histograms",
    "quantiles",
]

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
        self._summaries: list[dict] | None = None

    def add(self, values: torch.Tensor) -> None:
        """``values``: ``[tokens, n]`` float32, every row a real (unpadded) token."""
        self._summaries = None
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
        self._summaries = None
        dev = self.count.device
        for name in ("count", "total", "squares", "positive"):
            setattr(self, name, dist.all_reduce_sum(getattr(self, name), dev))
        self.hist = dist.all_reduce_sum(self.hist.double(), dev).round().long()
        parts = dist.gather((self.low.cpu(), self.high.cpu()))
        self.low = torch.stack([p[0] for p in parts]).amin(0).to(dev)
        self.high = torch.stack([p[1] for p in parts]).amax(0).to(dev)

    def summaries(self) -> list[dict]:
        """Every unit's numbers: the fields of :class:`capinterp.cards.contexts.ActivationStats`."""
        n = self.count.cpu()
        mean = self.total.cpu() / n
        std = (self.squares.cpu() / n - mean.square()).clamp(min=0).sqrt()
        low, high = self.low.double().cpu(), self.high.double().cpu()
        hist = self.hist.double().cpu()
        qs = quantiles(hist, low, high)
        edges, counts = display_histograms(hist, low, high)
        positive = self.positive.cpu() / n
        return [
            dict(
                count=int(n[j]),
                mean=float(mean[j]),
                std=float(std[j]),
                max=float(high[j]),
                min=float(low[j]),
                quantiles={q: float(qs[j, i]) for i, q in enumerate(QUANTILES)},
                frac_positive=float(positive[j]),
                histogram=_shown(edges[j], counts[j], float(low[j]), float(high[j])),
            )
            for j in range(len(n))
        ]

    def summary(self, j: int) -> dict:
        """Unit ``j``'s numbers (:meth:`summaries`, computed once for all units after the last batch)."""
        if self._summaries is None:
            self._summaries = self.summaries()
        return self._summaries[j]


def _shown(edges: torch.Tensor, counts: torch.Tensor, low: float, high: float) -> tuple:
    if not high > low:
        return (low, high), (int(counts.sum()),)
    return tuple(edges.tolist()), tuple(int(c) for c in counts.tolist())


def fine_bin(values: torch.Tensor) -> torch.Tensor:
    """The fine bin of each value (long, same shape)."""
    u = torch.asinh(values.double() / SCALE)
    return ((u + _SPAN) / _WIDTH).floor().clamp(0, FINE_BINS - 1).long()


def _value(u: torch.Tensor | float) -> torch.Tensor:
    return SCALE * torch.sinh(torch.as_tensor(u, dtype=torch.float64))


def quantiles(hist: torch.Tensor, low: torch.Tensor, high: torch.Tensor) -> torch.Tensor:
    """``[n, len(QUANTILES)]``: each unit's quantiles read off its fine histogram (``[n, FINE_BINS]``
    float64 counts), interpolated inside the bin in asinh space and clipped to ``[low, high]``."""
    cum = hist.cumsum(1)
    rank = torch.tensor(QUANTILES, dtype=torch.float64)[None] * cum[:, -1:]
    b = torch.searchsorted(cum, rank).clamp(max=FINE_BINS - 1)
    before = torch.where(b > 0, cum.gather(1, (b - 1).clamp(min=0)), 0.0)
    inside = hist.gather(1, b)
    frac = torch.where(inside > 0, (rank - before) / inside.clamp(min=1), 0.5).clamp(0, 1)
    x = _value(-_SPAN + (b + frac) * _WIDTH)
    return torch.minimum(torch.maximum(x, low[:, None]), high[:, None])


def display_histograms(hist: torch.Tensor, low: torch.Tensor, high: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(edges [n, DISPLAY_BINS + 1], counts [n, DISPLAY_BINS])``: equal bins on each unit's ``[low, high]``.

        Each fine bin's count is spread uniformly over its span clipped to ``[low, high]``, so a display
        bin gets the share of each fine bin it overlaps; counts are rounded by largest remainder, so they
        add up exactly. (A unit whose values are all equal: its count in the first bin of ``[low, low + 1]``;
    :meth:`RunningStats.summaries` shows it as one bin ``(low, high)``.)"""
    total = hist.sum(1, keepdim=True)
    flat = ~(high > low)
    top = torch.where(flat, low + 1, high)  # an equal-valued unit: any width, all of it in bin 0
    steps = torch.linspace(0, 1, DISPLAY_BINS + 1, dtype=torch.float64)[None]
    edges = low[:, None] + (top - low)[:, None] * steps
    fine = fine_bin(edges)
    a = torch.maximum(_value(-_SPAN + fine * _WIDTH), low[:, None])
    b = torch.minimum(_value(-_SPAN + (fine + 1) * _WIDTH), top[:, None])
    frac = torch.where(b > a, (edges - a) / (b - a).clamp(min=1e-300), (edges >= a).double()).clamp(0, 1)
    cum = hist.cumsum(1)
    below = torch.where(fine > 0, cum.gather(1, (fine - 1).clamp(min=0)), 0.0) + hist.gather(1, fine) * frac
    below[:, 0], below[:, -1] = 0.0, total[:, 0]
    below[flat, 1:] = total[flat]
    spread = below.diff(dim=1).clamp(min=0)
    whole = spread.floor()
    left = (total - whole.sum(1, keepdim=True)).round().long()
    order = torch.argsort(spread - whole, dim=1, descending=True).argsort(1)
    whole += (order < left).double()
    return edges, whole
