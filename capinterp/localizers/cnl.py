"""CNL: dataset-level capability neurons by integrated gradients (Huang et al. 2025, Sec. 5, Eqs. 7-8; docs/localizers/cnl.md).

    Attr_D(l, i) = mean over (x, y) in D of  a_{l,i} * (1/m) sum_k dF(a_l = (k/m) a_l) / da_{l,i}

summed over the teacher-forced answer positions, with F the mean probability of the answer
tokens. The mask keeps ``|Attr - mean| > sigma * std`` (global over all neurons, two-sided;
sigma = 6 as quoted by the reviewers). Cost: one IG kernel call per example (fast route)
(:func:`capinterp.kernels.ig.ig_scores`); scores are running sums, so a ``checkpoint=``
makes long fits resumable and shards mergeable (:class:`capinterp.kernels.accumulate.ScoreSum`).
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from capinterp.core.constraints import Options
from capinterp.core.protocol import Model
from capinterp.core.tokens import Encoded
from capinterp.kernels import ig
from capinterp.kernels.ig_config import IGConfig
from capinterp.kernels.memory import ig_row_bytes
from capinterp.localizers.base import register
from capinterp.localizers.dataset import DatasetNeuronLocalizer
from capinterp.localizers.ig_check import IGChecked, quiet_kernel_warnings

__all__ = ["CNL"]


@register("cnl")
class CNL(IGChecked, DatasetNeuronLocalizer):
    """Capability neurons: mean IG attribution over a dataset, then a sigma mask.

    Args:
        positions: ``"answer"`` (all answer-predicting positions) or ``"last_prompt"`` (KN-exact).
        batch_size: IG rows (layer x step points) per forward/backward; bounds peak memory.
            ``"auto"``: the largest that fits in free memory (halved on out-of-memory).
        **kwargs: the IG keywords below (:class:`~capinterp.localizers.ig_check.IGChecked`), then
            :class:`DatasetNeuronLocalizer`'s: ``sigma``, ``spread``, ``checkpoint`` (a path;
            running sums are saved after every example and resumed from), ``device``, ``progress``.

    Keyword Args:
        sigma: mask threshold in standard deviations of all scores (6).
        steps: interpolation points m (20, the KN/CNL grid).
        rule: quadrature of the IG path integral: ``"right"`` (k/m, weights 1/m: the papers'),
            ``"left"``, ``"midpoint"``, ``"trapezoid"``, ``"linspace"``, ``"gauss"``
            (Gauss-Legendre; :mod:`capinterp.kernels.quadrature`) or ``"adaptive"``
            (per layer, Gauss-Legendre nodes doubled from 4 until the error estimate is <= ``tol``;
            ``steps`` unused; :mod:`capinterp.kernels.adaptive`).
        objective: ``"prob"`` (default) or ``"logprob"``.
        route: how IG's rows run: ``"fast"`` (default) or the slower ``"prefix"`` / ``"loop"`` (same scores).
        invariance: ``"auto"`` (default) sums the rule in closed form from four nodes (3 rows per layer + 1 shared) on
            models whose FFN output is scale invariant (Gemma 2/3; scores within ~1e-4 of the
            largest, :mod:`capinterp.kernels.invariant`); ``"off"`` integrates node by node.
        tol: the adaptive rule's tolerance on each layer's error estimate (1e-3).
        max_steps: the adaptive rule's node cap per layer (256; a layer that reaches it above
            ``tol`` warns: the accuracy asked was not reached).
        completeness_tol: None (default): no tolerance asked; the completeness error
            ``|sum IG - (F(x) - F(0))| / |F(x) - F(0)|`` is reported per layer (``meta_["ig_check"]``,
            :meth:`summary`), not warned about. A number: also warn (once, naming the worst layers)
            when a layer's completeness error exceeds it on some example.

    ``fit`` runs :func:`capinterp.kernels.ig.ig_scores` with the
    :class:`~capinterp.kernels.ig_config.IGConfig` these build.

    ``meta_["ig_check"]`` (also in ``scores_.meta`` and ``neurons_.meta``, kept by save/load) holds,
    per layer, the completeness error's max and mean over every example of the data (examples
    resumed from a checkpoint too: their records are in it; under ``torchrun``, every rank's), the
    error estimate and the nodes, with the rule (by default named as the papers' approximation)
    and the verdict on the tolerance asked, if any; :meth:`summary` shows them.
    """

    chunk_examples = 1
    _ig_per_example = False

    _parameter_constraints: ClassVar[dict[str, list[Any]]] = {"positions": [Options(*ig.POSITIONS)]}

    def __init__(self, model: Model, *, positions: str = "answer", batch_size: int | str = 64, **kwargs: Any) -> None:
        # **kwargs: the IG keywords (IGChecked), then DatasetNeuronLocalizer's (sigma, spread, checkpoint,
        # device, progress)
        super().__init__(model, batch_size=batch_size, **kwargs)
        self.positions = positions
        self._ig_config(1)  # a rule's minimum of steps: refused here, before any work ("auto" batches: fit's)

    def _ig_config(self, batch_size: int) -> IGConfig:
        """The IG settings of a fit with rows of ``batch_size`` (ValueError on a bad hyper-parameter)."""
        return ig.check_config(self._ig_settings(self.positions, batch_size))

    def _row_bytes(self, items: list[Encoded]) -> int:
        longest = max(items, key=lambda it: len(it.prompt_ids) + len(it.target_ids))
        return ig_row_bytes(self.model, len(longest.prompt_ids) + len(longest.target_ids), len(longest.target_ids))

    def fit(self, data: Any) -> CNL:
        """:meth:`DatasetNeuronLocalizer.fit`, plus the per-layer completeness report (``meta_["ig_check"]``)."""
        self._ig_begin()
        with quiet_kernel_warnings():
            super().fit(data)
        self._ig_warn()
        return self

    def _set_meta(self, **extra: Any) -> dict[str, Any]:
        return super()._set_meta(**extra, ig_check=self._ig_report())

    def _count(self, work: Any, items: list, batch_size: int) -> None:
        from capinterp.localizers.cost_counts import ig_work

        ig_work(work, items, self._ig_config(batch_size))

    def _score_chunk(self, items: list[Encoded]) -> torch.Tensor:
        stats: dict = {}
        # built per chunk: an out-of-memory retry halves batch_size_
        scores = ig.ig_scores(self.model, items, self._ig_config(self.batch_size_), stats=stats)
        self._ig_add(stats)  # after success only: an out-of-memory retry scores the chunk again
        return scores
