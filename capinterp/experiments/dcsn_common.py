"""Shared pieces of the DCSN paper's experiments (anon. 2025, "Combination Generalization of
Capability-Specific Neurons in LLMs"): per-sample DCSN scores, operator neurons.

One forward pass per prompt gives both the single-sample DCSN score (Eq. 1)

    C_j[l, i] = a^l_{j,i} * (W_out[l] @ W_U)[i, t_j]      (t_j = first gold answer token)

and whether the model's greedy first token at the last prompt position equals ``t_j``. The
dataset-level score "on the examples the model gets right" is the mean of ``C_j`` over those
examples: the same numbers ``DCSN(model).fit(correct_examples).scores_`` gives, without a
separate decoding pass (``filter="greedy"`` uses :func:`capinterp.kernels.evaluate.evaluate` instead,
which also checks the answer's later tokens).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from capinterp.arch.model import model_meta
from capinterp.core.example import Example
from capinterp.core.protocol import Model
from capinterp.core.tokens import batches, encode
from capinterp.data import arithmetic
from capinterp.localizers.dataset import describe_data
from capinterp.localizers.dcsn import fold_for, per_sample_scores
from capinterp.units.neurons import NeuronScores, NeuronSet

__all__ = [
    "FILTERS",
    "OPS",
    "OP_NAMES",
    "Scorer",
    "context_scorer",
    "correct_scores",
    "direct_scorer",
    "one_op_data",
    "one_op_name",
    "operator_neurons",
    "sample_scores",
    "top_fraction",
    "union",
]

OPS: tuple[str, ...] = ("+", "-", "*", "/")
OP_NAMES: dict[str, str] = {"+": "add", "-": "sub", "*": "mul", "/": "div"}
FILTERS: tuple[str, ...] = ("first_token", "greedy", "none")

Scorer = Callable[[str, list[Example]], NeuronScores]


@torch.no_grad()
def sample_scores(
    model: Model, examples: Sequence[Example], batch_size: int = 16, norms: str = "raw"
) -> Iterator[tuple[list[int], torch.Tensor, torch.Tensor]]:
    """Yield ``(indices, scores [b, n_layers, d_mlp], first_token_correct [b])`` per batch (CPU).

    ``norms``: as :class:`~capinterp.localizers.dcsn.DCSN`'s (``"raw"`` or ``"fold"``)."""
    fold = fold_for(model, norms)
    encoded = encode(model, list(examples))
    for chunk in batches(list(range(len(encoded))), batch_size):
        out, tok, top = per_sample_scores(model, [encoded[i] for i in chunk], "gold", fold)
        yield chunk, out.cpu(), (top == tok).cpu()


def correct_scores(
    model: Model,
    examples: Sequence[Example],
    *,
    filter: str = "first_token",
    batch_size: int = 16,
    norms: str = "raw",
) -> NeuronScores:
    """Dataset-level DCSN scores over the examples the model gets right (mean of ``C_j``).

    ``filter``: ``"first_token"`` (greedy first token = gold first token, from the same forward),
    ``"greedy"`` (full greedy answer parsed per format, via ``evaluate``) or ``"none"``. When no
    example passes, all examples are used and ``meta["filter_fallback"]`` is True.
    ``meta["n_samples"]`` is the number averaged, ``meta["n_offered"]`` the number given.
    ``norms``: ``"raw"`` (the paper's projection) or ``"fold"`` (see :class:`~capinterp.DCSN`).
    """
    if filter not in FILTERS:
        raise ValueError(f"filter must be one of {FILTERS}, got {filter!r}")
    examples = list(examples)
    if not examples:
        raise ValueError("correct_scores got no examples")
    keep = [True] * len(examples)
    if filter == "greedy":
        from capinterp.kernels.evaluate import evaluate

        keep = [r["correct"] for r in evaluate(model, examples, batch_size=batch_size, progress=False).records]
    total = torch.zeros(model.cfg.n_layers, model.cfg.d_mlp, dtype=torch.float64)
    every = torch.zeros_like(total)
    n = 0
    for idx, scores, first_ok in sample_scores(model, examples, batch_size, norms):
        ok = first_ok if filter == "first_token" else torch.tensor([keep[i] for i in idx])
        every += scores.double().sum(0)
        total += scores[ok].double().sum(0)
        n += int(ok.sum())
    fallback = n == 0
    mean = (every / len(examples)) if fallback else total / n
    meta = {
        "method": "dcsn",
        "params": {"target": "gold", "filter": filter, "norms": norms},
        **model_meta(model),
        "dataset": describe_data(examples),
        "n_samples": len(examples) if fallback else n,
        "n_offered": len(examples),
        "filter_fallback": fallback,
    }
    return NeuronScores(mean.float(), meta=meta)


def top_fraction(scores: NeuronScores, neurons: NeuronSet, fraction: float) -> NeuronSet:
    """The ``ceil(fraction * |N|)`` neurons of ``N`` with the largest ``|C - mean(C)|``.

    ``fraction >= 1`` returns ``N`` itself (the DCSN paper, anon. 2025, erases "10% of capability neurons").
    """
    if not fraction > 0:
        raise ValueError(f"fraction must be > 0, got {fraction}")
    if fraction >= 1 or len(neurons) == 0:
        return neurons
    k = max(1, math.ceil(fraction * len(neurons)))
    s = scores.scores.double()
    dev = (s - (s[scores.valid].mean() if scores.padded else s.mean())).abs()  # mean over the real neurons
    dev[~neurons.mask] = -1.0
    flat = torch.sort(dev.flatten(), descending=True, stable=True).indices[:k]
    mask = torch.zeros(dev.numel(), dtype=torch.bool)
    mask[flat] = True
    meta = {**neurons.meta, "selection": {**neurons.meta.get("selection", {}), "top_fraction": fraction}}
    return NeuronSet(mask.view(neurons.shape), meta)


def union(sets: Sequence[NeuronSet], like: NeuronSet) -> NeuronSet:
    """Union of ``sets`` (an empty set shaped like ``like`` when there are none)."""
    out = like.empty_like()
    for s in sets:
        out = out | s
    return out


def one_op_data(
    op: str, n: int, seed: int, fmt: str = "DG", lang: str = "en", style: str = "compact", shots: int = 4
) -> list[Example]:
    """``n`` 1-OP arithmetic examples of one operator (the DCSN paper, anon. 2025, neuron-identification part)."""
    return arithmetic(ops=op, n=n, fmt=fmt, lang=lang, seed=seed, style=style, shots=shots)


def one_op_name(op: str, seed: int, fmt: str = "DG", lang: str = "en", style: str = "compact", shots: int = 4) -> str:
    """The cache name of :func:`one_op_data` with these arguments (shared across experiments)."""
    return f"{OP_NAMES[op]}_{fmt}_{lang}_{style}{shots}_s{seed}"


def direct_scorer(model: Model, filter: str = "first_token", batch_size: int = 16, norms: str = "raw") -> Scorer:
    """A :data:`Scorer` computing :func:`correct_scores` with no caching (tests, notebooks, scripts)."""
    return lambda name, examples: correct_scores(model, examples, filter=filter, batch_size=batch_size, norms=norms)


def context_scorer(ctx: Any, filter: str = "first_token") -> Scorer:
    """A :data:`Scorer` caching :func:`correct_scores` in ``ctx.workdir`` (shared by experiments)."""

    def score(name: str, examples: list[Example]) -> NeuronScores:
        key = f"dcsn-correct_{name}_n{len(examples)}_{filter}"
        return ctx.scores(key, lambda: correct_scores(ctx.model, examples, filter=filter, batch_size=ctx.batch_size))

    return score


def operator_neurons(
    scorer: Scorer, n: int, seed: int, sigma: float = 6.0, ops: Sequence[str] = OPS, **data: Any
) -> tuple[dict[str, NeuronScores], dict[str, NeuronSet]]:
    """Scores and sigma-masked neuron sets of each operator, from ``n`` 1-OP examples each."""
    scores = {op: scorer(one_op_name(op, seed, **data), one_op_data(op, n, seed, **data)) for op in ops}
    return scores, {op: s.select(sigma=sigma) for op, s in scores.items()}
