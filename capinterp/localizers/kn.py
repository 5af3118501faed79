"""KN: knowledge neurons by integrated gradients (Dai et al. 2022, Sec. 3; docs/localizers/kn.md).

For each prompt x_j of a fact (a bag of paraphrases with one answer), IG scores every neuron
at the last prompt token for the first answer token. Per prompt, the coarse set keeps
positive scores above ``threshold * max`` (0.2, Dai); the refined set keeps neurons present
in more than ``share * n`` coarse sets (0.5, the EleutherAI default; strict ">"). With
``refine=False`` the result is the union of the coarse sets (Know-MRI's default).
Plain-string prompts get the model's greedy next token as target.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from tqdm.auto import tqdm

from capinterp.core import validate
from capinterp.core.constraints import Boolean, Interval
from capinterp.core.protocol import Model
from capinterp.core.tokens import encode
from capinterp.kernels import ig
from capinterp.kernels.ig_config import IGConfig
from capinterp.localizers.base import Localizer, register
from capinterp.localizers.dataset import describe_data, fill_greedy_targets
from capinterp.localizers.ig_check import IGChecked, quiet_kernel_warnings
from capinterp.units.neurons import NeuronScores, NeuronSet

__all__ = ["KN", "coarse_mask"]


def coarse_mask(scores: torch.Tensor, threshold: float) -> torch.Tensor:
    """Neurons whose score is positive and above ``threshold * max`` (max over all neurons)."""
    top = scores.max()
    if top <= 0:
        return torch.zeros_like(scores, dtype=torch.bool)
    return scores > threshold * top


@register("kn")
class KN(IGChecked, Localizer):
    """Knowledge neurons of one fact from its paraphrased prompts.

    Args:
        threshold: coarse threshold t, relative to each prompt's max score (0.2).
        share: refined set = neurons in more than ``share * n`` coarse sets (0.5).
        refine: False keeps the union of the coarse sets.
        batch_size: IG rows per forward and backward (64).
        **kwargs: the IG keywords below (:class:`~capinterp.localizers.ig_check.IGChecked`),
            ``device`` and ``progress``.

    Keyword Args:
        steps: IG interpolation points (20).
        rule: IG interpolation rule, as for :class:`capinterp.CNL`.
        objective: IG objective, as for :class:`capinterp.CNL`.
        route: how IG's rows run, as for :class:`capinterp.CNL`.
        invariance: closed-form sums on scale-invariant models, as for :class:`capinterp.CNL`.
        tol: the adaptive rule's tolerance, as for :class:`capinterp.CNL`.
        max_steps: the adaptive rule's node cap, as for :class:`capinterp.CNL`.
        completeness_tol: None (default: report only) or a tolerance to warn above, as for :class:`capinterp.CNL`.

    ``fit`` runs :func:`capinterp.kernels.ig.ig_scores` with the
    :class:`~capinterp.kernels.ig_config.IGConfig` these build (``positions="last_prompt"``).

    ``meta_["ig_check"]`` (also in the results' metadata) holds each prompt's per-layer completeness
    error and its max / mean over prompts; :meth:`summary` shows them per layer.
    """

    scope = "fact"
    per_query = True
    fills_greedy = True  # fit: fill_greedy_targets

    _parameter_constraints: ClassVar[dict[str, list[Any]]] = {
        "threshold": [Interval(float, 0, 1, closed="left")],
        "share": [Interval(float, 0, 1, closed="left")],
        "refine": [Boolean()],
    }

    def __init__(
        self,
        model: Model,
        *,
        threshold: float = 0.2,
        share: float = 0.5,
        refine: bool = True,
        batch_size: int = 64,
        **kwargs: Any,
    ) -> None:
        # **kwargs: the IG keywords (IGChecked: steps, rule, objective, route, invariance, tol,
        # max_steps, completeness_tol), then device and progress (Localizer)
        super().__init__(model, batch_size=batch_size, **kwargs)
        self.threshold, self.share, self.refine = float(threshold), float(share), bool(refine)
        self._ig_config()  # a rule's minimum of steps, what the kernel runs: refused here, before any work

    def _ig_config(self) -> IGConfig:
        """The IG settings of a fit, from the hyper-parameters (ValueError on a bad one)."""
        return ig.check_config(self._ig_settings("last_prompt", self.batch_size))

    def _prompt_scores(self, item, config: IGConfig) -> torch.Tensor:
        """IG scores ``[n_layers, d_mlp]`` of one encoded prompt (subclasses change the path);
        the kernel's completeness records go to :meth:`_ig_add`."""
        stats: dict = {}
        scores = ig.ig_scores(self.model, item, config, stats=stats, **self._path_kwargs())[0]
        self._ig_add(stats)
        return scores

    def _cost(self, data: Any) -> Any:
        """The work of ``fit(data)``, counted before any model work (:meth:`Localizer.estimate`)."""
        from capinterp.localizers.cost_counts import items_for
        from capinterp.localizers.cost_work import Work

        examples = validate.examples(data, f"{type(self).__name__}.fit(data)", min_count=0)
        if not examples:
            raise ValueError(f"{type(self).__name__}.fit got no prompts")
        work = Work(validate.model(self.model))
        self._count(work, items_for(work, examples, max_target_tokens=1))
        return work

    def _count(self, work: Any, items: list) -> None:
        """Add the kernel's rows on ``items`` to ``work`` (SIG, AMIG: their own kernel and baseline)."""
        from capinterp.localizers.cost_counts import ig_work

        ig_work(work, items, self._ig_config())

    def _path_kwargs(self) -> dict:
        """Extra ``ig_scores`` arguments that set the integration path (AMIG: its baseline)."""
        return {}

    def _coarse(self, scores: torch.Tensor) -> torch.Tensor:
        """One prompt's coarse set (subclasses may adapt the threshold)."""
        return coarse_mask(scores, self.threshold)

    def fit(self, data: Any) -> KN:
        """IG scores of every prompt of one fact (``data``: paraphrased prompts, strings or Examples):
        ``prompt_scores_`` ``[n, n_layers, d_mlp]``, ``coarse_``, ``counts_``, ``scores_`` (mean), ``neurons_``."""
        examples = validate.examples(data, "KN.fit(data)", min_count=0)
        if not examples:
            raise ValueError("KN.fit got no prompts")
        validate.model(self.model)  # before the tokenizer is read
        encode(self.model, examples, max_target_tokens=1, bare="skip")  # TokenizationError before any work
        self._begin_fit()
        examples = fill_greedy_targets(self.model, examples)
        items = encode(self.model, examples, max_target_tokens=1)
        self._ig_begin()
        config = self._ig_config()
        with quiet_kernel_warnings():
            per = torch.stack(
                [self._prompt_scores(it, config) for it in tqdm(items, desc=self.name, disable=not self.progress)]
            )
        meta = self._set_meta(dataset=describe_data(examples), n_samples=len(items), ig_check=self._ig_report())
        coarse = [self._coarse(s) for s in per]
        self.prompt_scores_ = per
        self.coarse_ = [NeuronSet(c, meta=meta) for c in coarse]
        self.counts_ = torch.stack(coarse).sum(0)
        mask = self.counts_ > self.share * len(items) if self.refine else self.counts_ > 0
        self.scores_ = NeuronScores(per.mean(0), meta=meta)
        self.neurons_ = NeuronSet(
            mask, meta={**meta, "selection": {"threshold": self.threshold, "share": self.share, "refine": self.refine}}
        )
        self.units_ = self.neurons_
        self._ig_warn()
        return self
