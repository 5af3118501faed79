"""Per-prompt knowledge neurons shared by the fidelity, reliability and decoupling experiments.

A prompt's KN set is KN's coarse set for that single prompt (Dai et al. 2022, Sec. 3.3): IG scores at the
last prompt token for the target's first token, kept when positive and above ``threshold * max``
(0.2). With one prompt, KN's refined set equals this coarse set. The IG scores are cached through
``cache`` (``Context.scores``), keyed by a hash of the prompt and target, so experiments that
locate the same prompt with the same steps share one fit and an interrupted run resumes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

from capinterp.core.example import Example
from capinterp.core.protocol import Model
from capinterp.localizers.dataset import fill_greedy_targets
from capinterp.localizers.kn import KN
from capinterp.units.neurons import NeuronScores, NeuronSet

__all__ = ["ScoreCache", "example_key", "kn_neurons", "kn_scores", "with_greedy_targets"]

ScoreCache = Callable[[str, Callable[[], NeuronScores]], NeuronScores]


def example_key(ex: Example) -> str:
    """A short stable id of an example's text (prompt and target)."""
    return hashlib.sha256(f"{ex.prompt}\x00{ex.target}".encode()).hexdigest()[:12]


def with_greedy_targets(model: Model, examples: list[Example]) -> list[Example]:
    """Examples with an empty target get the model's greedy next token (``meta["target_from"]="greedy"``)."""
    return fill_greedy_targets(model, list(examples))


def kn_scores(
    model: Model, ex: Example, *, steps: int, rule: str = "right", cache: ScoreCache | None = None
) -> NeuronScores:
    """IG scores [n_layers, d_mlp] of one prompt for its target's first token (KN's per-prompt scores);
    ``rule``: the IG quadrature (:mod:`capinterp.kernels.quadrature`)."""
    if not ex.target:
        raise ValueError(f"example {ex.prompt[-40:]!r} has no target; fill it first (with_greedy_targets)")

    def fit() -> NeuronScores:
        kn = KN(model, steps=steps, rule=rule, progress=False).fit([ex])
        return NeuronScores(kn.prompt_scores_[0], meta=kn.scores_.meta)

    if cache is None:
        return fit()
    return cache(f"kn1_{example_key(ex)}_steps{steps}" + ("" if rule == "right" else f"_{rule}"), fit)


def kn_neurons(scores: NeuronScores, threshold: float = 0.2) -> NeuronSet:
    """KN's coarse set: positive scores above ``threshold`` times the prompt's max score."""
    return scores.threshold(threshold, relative=True)
