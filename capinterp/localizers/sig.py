"""SIG: knowledge neurons by sequential integrated gradients (Enguehard 2023; Chen et al. 2025 Sec. 3).

KN (Dai et al. 2022) scales the last prompt token's activations from 0 to their value. SIG
scales one prompt token at a time (the others stay clean) and sums the per-position
attributions, so a neuron that matters at the subject's tokens is credited too
(:func:`capinterp.kernels.sequential.sig_scores`). Thresholds, refinement and outputs are KN's
(coarse ``t * max`` per prompt, refined by ``share``), so SIG drops into
:class:`~capinterp.QueryLocalization` (``localizer="sig"``) like KN.
"""

from __future__ import annotations

from typing import Any

import torch

from capinterp.kernels.quadrature import ADAPTIVE_MAX_STEPS, ADAPTIVE_TOL, check_rule
from capinterp.kernels.sequential import sig_scores
from capinterp.localizers.base import register
from capinterp.localizers.ig_check import COMPLETENESS_TOL
from capinterp.localizers.kn import KN

__all__ = ["SIG"]


@register("sig")
class SIG(KN):
    """Knowledge neurons of one fact by sequential IG.

    Args:
        steps: interpolation points per position (20).
        positions: ``"prompt"`` (every prompt token after the BOS, default) or ``"last_prompt"``
            (the last prompt token only: then SIG equals KN's IG).
        rule: any rule of :mod:`capinterp.kernels.quadrature` (``"right"``, the papers', or
            ``"gauss"`` for an accurate integral at few points).
        kernel: ``"loop"`` only (the sequential kernel; KN's fast kernels scale all positions at once).

    ``threshold``, ``share``, ``refine``, ``objective`` and ``completeness_tol`` are
    :class:`capinterp.KN`'s (``tol`` and ``max_steps`` too, unused: SIG has no adaptive rule).
    """

    per_query = True

    def __init__(
        self,
        model: Any,
        *,
        steps: int = 20,
        positions: str = "prompt",
        threshold: float = 0.2,
        share: float = 0.5,
        refine: bool = True,
        rule: str = "right",
        objective: str = "prob",
        kernel: str = "loop",
        invariance: str = "off",
        batch_size: int = 64,
        device: Any = None,
        progress: bool = True,
        tol: float = ADAPTIVE_TOL,
        max_steps: int = ADAPTIVE_MAX_STEPS,
        completeness_tol: float = COMPLETENESS_TOL,
    ) -> None:
        if kernel != "loop":
            raise ValueError(f"SIG runs its own sequential kernel: kernel must be 'loop', got {kernel!r}")
        if invariance != "off":  # its path scales one token at a time: no closed form
            raise ValueError(f"SIG integrates node by node: invariance must be 'off', got {invariance!r}")
        check_rule(steps, rule)  # a fixed rule: the sequential kernel has no adaptive one
        if positions not in ("prompt", "last_prompt"):
            raise ValueError(f"positions must be 'prompt' or 'last_prompt', got {positions!r}")
        super().__init__(
            model,
            steps=steps,
            threshold=threshold,
            share=share,
            refine=refine,
            rule=rule,
            objective=objective,
            kernel="loop",
            invariance="off",
            batch_size=batch_size,
            device=device,
            progress=progress,
            tol=tol,
            max_steps=max_steps,
            completeness_tol=completeness_tol,
        )
        self.positions = positions

    def _prompt_scores(self, item) -> torch.Tensor:
        pos = None if self.positions == "prompt" else [item.last_prompt_pos]
        stats: dict = {}
        scores = sig_scores(
            self.model,
            item,
            steps=self.steps,
            rule=self.rule,
            objective=self.objective,
            positions=pos,
            batch_size=self.batch_size,
            stats=stats,
        )
        self._ig_add(stats)
        return scores
