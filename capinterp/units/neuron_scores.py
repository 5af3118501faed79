"""Per-neuron scores over ``blocks.{l}.mlp.hook_post``: a float32 CPU ``[n_layers, d_mlp]`` tensor and
metadata, and the rules that turn them into a :class:`~capinterp.units.neuron_set.NeuronSet`.

Selection rules (Huang et al. 2025, Eq. 8; the DCSN paper, anon. 2025, Eq. 2; docs/localizers/cnl.md):

- ``select(sigma)``: Mask(l,i) = |s(l,i) - mean(s)| > sigma * spread(s), mean and spread taken over
  all L*d_mlp neurons (the model's real neurons only where layers differ in width: ``valid``); spread = population std (default) or variance (fidelity checks only);
  ``two_sided=False`` keeps only s - mean > sigma * spread.
- ``top_k(k)``: the k largest scores (``by="abs"``: |scores|); ties go to the lower flat index.
  "Top" means the same everywhere: :meth:`NeuronScores.to_frame` ``(top=k)`` lists exactly the
  neurons ``top_k(k)`` selects, in rank order, with the same ``by``.
- ``threshold(t)``: s > t; ``relative=True``: s > t * max(s) and s > 0 (KN's coarse rule).

Padding neurons (``valid`` False: past a narrower layer's own width) are never selected and take
no part in any statistic.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from capinterp.core import validate
from capinterp.units.neuron_set import NeuronSet, _ig_note
from capinterp.units.neuron_tensor import NeuronTensor

__all__ = ["NeuronScores"]


class NeuronScores(NeuronTensor):
    """Float32 per-neuron scores, shape [n_layers, d_mlp], plus metadata (see module docstring)."""

    _tensor_name = "scores"

    def __init__(self, scores: Float[Tensor, "n_layers d_mlp"] | np.ndarray, meta: dict | None = None) -> None:
        t = self._as_2d(scores, "scores").to(torch.float32).clone().contiguous()
        if not torch.isfinite(t).all():
            raise ValueError(f"scores hold {int((~torch.isfinite(t)).sum())} non-finite values (NaN/inf)")
        self.scores: Float[Tensor, "n_layers d_mlp"] = t
        self._init_meta(meta)

    def _data(self) -> Tensor:
        return self.scores

    def __getitem__(self, key: Any) -> Float[Tensor, ...]:
        """``scores[l]`` is layer l's row [d_mlp]; any torch index works."""
        return self.scores[key]

    def _make_set(self, mask: Tensor, selection: dict[str, Any]) -> NeuronSet:
        meta = copy.deepcopy(self.meta)
        meta["selection"] = selection
        return NeuronSet(mask, meta)

    def select(self, sigma: float = 6.0, spread: str = "std", two_sided: bool = True) -> NeuronSet:
        """Neurons with |s - mean(s)| > sigma * spread(s) (global over all neurons; population std/var)."""
        sigma = validate.finite_float("sigma", sigma, low=0.0, low_open=True)
        s = self.scores.double()[self.valid]
        if spread not in ("std", "var"):
            raise ValueError(f"spread must be 'std' or 'var', got {spread!r}")
        sp = s.std(correction=0) if spread == "std" else s.var(correction=0)
        mean = s.mean()
        dev = self.scores.double() - mean
        mask = ((dev.abs() if two_sided else dev) > sigma * sp) & self.valid
        return self._make_set(
            mask,
            {
                "criterion": "sigma",
                "sigma": float(sigma),
                "spread": spread,
                "two_sided": bool(two_sided),
                "mean": float(mean),
                "spread_value": float(sp),
            },
        )

    def top_k(self, k: int, by: str = "score") -> NeuronSet:
        """The k neurons with the largest score (``by="score"``) or |score| (``by="abs"``)."""
        if by not in ("score", "abs"):
            raise ValueError(f"by must be 'score' or 'abs', got {by!r}")
        real = self.valid.flatten()
        validate.integer("k", k, low=0, high=int(real.sum()))
        flat = self.scores.flatten()
        key = (flat.abs() if by == "abs" else flat).masked_fill(~real, -torch.inf)  # padding ranks last
        order = torch.sort(key, descending=True, stable=True).indices
        mask = torch.zeros(flat.numel(), dtype=torch.bool)
        mask[order[: int(k)]] = True
        return self._make_set(mask.view(self.shape), {"criterion": "top_k", "k": int(k), "by": by})

    def threshold(self, t: float, relative: bool = False) -> NeuronSet:
        """s > t, or with ``relative=True`` s > t * max(s) and s > 0 (only positive scores count)."""
        t, relative = validate.finite_float("t", t), validate.boolean("relative", relative)
        cut = t * float(self.scores[self.valid].max()) if relative else t
        mask = (self.scores > cut) & self.valid
        if relative:
            mask &= self.scores > 0
        return self._make_set(mask, {"criterion": "threshold", "t": float(t), "relative": bool(relative), "cut": cut})

    def to_frame(self, top: int | None = None, by: str = "score") -> pd.DataFrame:
        """Columns layer, neuron, score; with ``top``, the rows of the neurons :meth:`top_k` ``(top, by)``
        selects, best first: the largest scores (``by="score"``, the default, as ``top_k``) or the
        largest |scores| (``by="abs"``); ties go to the lower flat index, as in ``top_k``."""
        if by not in ("score", "abs"):
            raise ValueError(f"by must be 'score' or 'abs', got {by!r}")
        n_layers, d_mlp = self.shape
        s = self.scores.flatten().numpy()
        df = pd.DataFrame(
            {"layer": np.repeat(np.arange(n_layers), d_mlp), "neuron": np.tile(np.arange(d_mlp), n_layers), "score": s}
        )
        if self.padded:  # the model's own neurons only
            df = df[self.valid.flatten().numpy()].reset_index(drop=True)
            s = df["score"].to_numpy()
        if top is not None:
            validate.nonneg_int("top", top)
            key = np.abs(s) if by == "abs" else s
            df = df.iloc[np.argsort(-key, kind="stable")[: int(top)]].reset_index(drop=True)
        return df

    def __repr__(self) -> str:
        s = self.scores[self.valid]
        return (
            f"NeuronScores({self.n_layers} layers x {self.d_mlp} neurons, method={self.meta.get('method')!r}, "
            f"min={float(s.min()):.4g}, max={float(s.max()):.4g}, mean={float(s.mean()):.4g}{_ig_note(self.meta)})"
        )
