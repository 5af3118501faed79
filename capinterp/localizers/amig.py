"""AMIG: knowledge neurons by IG from a baseline activation (Chen et al. 2024a; Chen et al. 2025 Sec. 3).

KN integrates each neuron's activation from 0, which says "how much does this neuron matter
compared with being silent"; but a silent neuron is not a neutral one. AMIG integrates from a
**baseline activation vector** b (``[n_layers, d_mlp]``): by default the mean activation over
unrelated text (every non-BOS token of ``baseline_texts``, or of a seeded sample of the local
data folder), or a tensor the caller passes. IG_l = (a - b) * mean_k dF/da(b + alpha_k (a - b))
runs on the IG kernel's fast route (:func:`capinterp.kernels.ig.ig_scores` with ``baseline=``).

Adaptive threshold (reconstruction: the paper gives "adaptive threshold x max"): each prompt's
coarse set starts at ``threshold * max`` and the ratio moves by 0.05, at most ``adapt_steps``
times, until the set has between ``min_neurons`` and ``max_neurons`` neurons. Refinement by
``share`` is KN's; usable by :class:`~capinterp.QueryLocalization` (``localizer="amig"``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, ClassVar

import torch

from capinterp.arch.model import model_fingerprint, neuron_hook, neuron_shape
from capinterp.core.constraints import NO_VALIDATION, PATH, Interval, Texts
from capinterp.core.protocol import Model
from capinterp.core.tokens import batches, model_bos, pad_id, pad_right
from capinterp.data.corpus import local_texts
from capinterp.localizers.base import register
from capinterp.localizers.kn import KN, coarse_mask

__all__ = ["AMIG", "mean_activations"]


@torch.no_grad()
def mean_activations(model: Model, texts: Sequence[str], max_tokens: int = 64, batch_size: int = 8) -> torch.Tensor:
    """Mean ``hook_post`` of every layer over every non-BOS token of ``texts``: ``[n_layers, d_mlp]`` float32 (CPU)."""
    if isinstance(texts, str) or not texts:
        raise ValueError("texts must be a non-empty list of strings")
    n_layers, d_mlp = neuron_shape(model)
    bos, dev = model_bos(model), model.cfg.device
    seqs = [
        ids
        for ids in (
            bos + list(model.tokenizer(t, add_special_tokens=False)["input_ids"])[: max_tokens - len(bos)]
            for t in texts
        )
        if len(ids) > len(bos)
    ]
    if not seqs:
        raise ValueError("texts hold no tokens")
    total = torch.zeros(n_layers, d_mlp, dtype=torch.float64)
    n = 0
    for chunk in batches(seqs, batch_size):
        tokens, lengths = pad_right(chunk, pad_id(model.tokenizer))
        pos = torch.arange(tokens.shape[1])[None]
        real = ((pos < lengths[:, None]) & (pos >= len(bos))).to(dev)

        def add(act, hook, real=real):
            total[int(hook.name.split(".")[1])] += act[real].double().sum(0).cpu()

        model.run_with_hooks(tokens.to(dev), fwd_hooks=[(neuron_hook(l), add) for l in range(n_layers)])
        n += int(real.sum())
    return (total / n).float()


@register("amig")
class AMIG(KN):
    """Knowledge neurons of one fact by IG from a mean-activation baseline, with an adaptive threshold.

    Args:
        baseline: ``[n_layers, d_mlp]`` (or ``[d_mlp]``) tensor, or None for the mean activation
            over ``baseline_texts`` (default: 32 texts sampled from ``data_dir``, the shared data
            folder by default).
        baseline_texts: texts for the mean-activation baseline.
        data_dir: folder of local texts used when neither ``baseline`` nor ``baseline_texts`` is given.
        min_neurons: the adaptive coarse set's lower size bound (2).
        max_neurons: its upper size bound (20).
        adapt_steps: at most this many 0.05 moves of the coarse ratio (6).

    ``steps``, ``threshold``, ``share``, ``refine``, ``rule`` (``"adaptive"`` too), ``objective``,
    ``route``, ``tol``, ``max_steps``, ``completeness_tol`` and
    ``invariance`` (moot here: a baseline always integrates node by node) are
    :class:`capinterp.KN`'s.
    """

    per_query = True
    check_params: ClassVar[dict[str, Any]] = {
        "baseline_texts": ["The weather was mild all week.", "She read the letter twice."]
    }

    _parameter_constraints: ClassVar[dict[str, list[Any]]] = {
        "baseline": [NO_VALIDATION],  # a tensor: its dimensions are checked below, its width in fit
        "baseline_texts": [Texts(), None],
        "data_dir": [PATH, None],
        "min_neurons": [Interval(int, 1, None)],
        "max_neurons": [Interval(int, 1, None)],
        "adapt_steps": [Interval(int, 0, None)],
    }

    def __init__(
        self,
        model: Model,
        *,
        baseline: torch.Tensor | None = None,
        baseline_texts: Sequence[str] | None = None,
        data_dir: str | os.PathLike | None = None,
        min_neurons: int = 2,
        max_neurons: int = 20,
        adapt_steps: int = 6,
        **kwargs: Any,
    ) -> None:
        # **kwargs: KN's (threshold, share, refine, the IG keywords, device, progress)
        super().__init__(model, **kwargs)
        if min_neurons > max_neurons:
            raise ValueError(f"need 1 <= min_neurons <= max_neurons, got {min_neurons}, {max_neurons}")
        if baseline is not None:
            baseline = torch.as_tensor(baseline, dtype=torch.float32)
            if baseline.dim() not in (1, 2):
                raise ValueError(f"baseline must be [n_layers, d_mlp] or [d_mlp], got {tuple(baseline.shape)}")
        # The baseline tensor is not a listed hyper-parameter (get_params / meta_ keep plain values).
        self._baseline = baseline
        self.baseline_texts = None if baseline_texts is None else list(baseline_texts)
        self.data_dir = None if data_dir is None else str(data_dir)
        self.min_neurons, self.max_neurons, self.adapt_steps = int(min_neurons), int(max_neurons), int(adapt_steps)

    def _begin_fit(self) -> None:
        """The baseline activation ``baseline_`` ``[n_layers, d_mlp]``: the given tensor, checked against
        the model, or the mean activation over the baseline texts (forward passes: fit's work)."""
        super()._begin_fit()
        n_layers, d_mlp = neuron_shape(self.model)
        baseline = self._baseline
        if baseline is None:
            key = model_fingerprint(self.model)  # refits on unchanged weights reuse it (QueryLocalization)
            if getattr(self, "_baseline_key", None) == key:
                return
            texts = self.baseline_texts if self.baseline_texts is not None else local_texts(self.data_dir, n=32)
            baseline = mean_activations(self.model, texts)
            self._baseline_key = key
        if baseline.shape == (d_mlp,):
            baseline = baseline.expand(n_layers, d_mlp).clone()
        if tuple(baseline.shape) != (n_layers, d_mlp):
            raise ValueError(f"baseline must be [{n_layers}, {d_mlp}] or [{d_mlp}], got {tuple(baseline.shape)}")
        self.baseline_ = baseline.to(torch.float32)

    def _count(self, work: Any, items: list) -> None:
        """The baseline's forward passes (when fit computes it), then IG from that baseline."""
        from capinterp.core.tokens import encode_prompt
        from capinterp.localizers.cost_counts import forward_work, ig_work

        key = getattr(self, "_baseline_key", None)  # None: no baseline yet (no fingerprint needed to know)
        if self._baseline is None and (key is None or key != model_fingerprint(self.model)):
            texts = self.baseline_texts if self.baseline_texts is not None else local_texts(self.data_dir, n=32)
            lengths = [min(64, len(encode_prompt(self.model, t))) for t in texts]
            forward_work(work, "baseline", sorted(lengths), 8, logits=64)
        ig_work(work, items, self._ig_config(), baseline=True)

    def _path_kwargs(self) -> dict:
        return {"baseline": self.baseline_}

    def _coarse(self, scores: torch.Tensor) -> torch.Tensor:
        t = self.threshold
        mask = coarse_mask(scores, t)
        for _ in range(self.adapt_steps):
            n = int(mask.sum())
            if n > self.max_neurons and t + 0.05 < 1:
                t += 0.05
            elif n < self.min_neurons and t - 0.05 >= 0:
                t -= 0.05
            else:
                break
            mask = coarse_mask(scores, t)
        return mask
