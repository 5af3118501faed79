"""SIG: knowledge neurons by sequential integrated gradients (Enguehard 2023; Chen et al. 2025 Sec. 3).

KN (Dai et al. 2022) scales the last prompt token's activations from 0 to their value. SIG
scales one prompt token at a time (the others stay clean) and sums the per-position
attributions, so a neuron that matters at the subject's tokens is credited too
(:func:`capinterp.kernels.sequential.sig_scores`). Thresholds, refinement and outputs are KN's
(coarse ``t * max`` per prompt, refined by ``share``), so SIG drops into
:class:`~capinterp.QueryLocalization` (``localizer="sig"``) like KN.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from capinterp.core.constraints import Options
from capinterp.core.protocol import Model
from capinterp.kernels import sequential
from capinterp.kernels.ig_config import IGConfig
from capinterp.localizers.base import register
from capinterp.localizers.kn import KN

__all__ = ["SIG"]


@register("sig")
class SIG(KN):
    """Knowledge neurons of one fact by sequential IG.

    Args:
        positions: ``"prompt"`` (every prompt token after the BOS, default) or ``"last_prompt"``
            (the last prompt token only: then SIG equals KN's IG).
        invariance: ``"off"`` only (the path scales one token at a time: no closed form).
        **kwargs: :class:`capinterp.KN`'s (the IG keywords, ``threshold``, ``share``, ``refine``,
            ``batch_size``, ``device``, ``progress``).

    Keyword Args:
        steps: interpolation points per position (20).
        rule: any rule of :mod:`capinterp.kernels.quadrature` (``"right"``, the papers', or
            ``"gauss"`` for an accurate integral at few points).
        route: how the sequential kernel's rows run: ``"fast"`` (default, the layer staircase) or
            ``"loop"`` (a full forward per row; same scores to float32 noise).

    ``threshold``, ``share``, ``refine``, ``objective`` and ``completeness_tol`` are
    :class:`capinterp.KN`'s (``tol`` and ``max_steps`` too, unused: SIG has no adaptive rule).
    ``fit`` runs :func:`capinterp.kernels.sequential.sig_scores` with the
    :class:`~capinterp.kernels.ig_config.IGConfig` these build.
    """

    per_query = True

    _parameter_constraints: ClassVar[dict[str, list[Any]]] = {"positions": [Options(*sequential.POSITIONS)]}

    def __init__(self, model: Model, *, positions: str = "prompt", invariance: str = "off", **kwargs: Any) -> None:
        # **kwargs: KN's (threshold, share, refine, the IG keywords, device, progress)
        self.positions = positions  # before KN's constructor checks the settings (_ig_config)
        super().__init__(model, invariance=invariance, **kwargs)

    def _ig_config(self) -> IGConfig:
        return sequential.check_config(self._ig_settings(self.positions, self.batch_size))

    def _count(self, work: Any, items: list) -> None:
        from capinterp.localizers.cost_counts import sig_work

        sig_work(work, items, self._ig_config(), self.positions)

    def _prompt_scores(self, item, config: IGConfig) -> torch.Tensor:
        stats: dict = {}
        scores = sequential.sig_scores(self.model, item, config, stats=stats)
        self._ig_add(stats)
        return scores
