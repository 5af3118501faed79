"""The activation side of a unit card: top activating contexts and the activation distribution.

:func:`top_contexts` streams texts through the model in batches (right padding; padded positions
never count), reads every requested neuron in the same forward (one hook per layer that holds
requested neurons, the forward stopped after the last such layer) and keeps, per neuron, a
running top-k of token positions with the activations around each, and running statistics:
memory is ``O(n_neurons * k * window)`` plus one batch, whatever the corpus size.
:func:`activation_stats` keeps only the statistics. Exact: count, mean, std, min, max, share
positive; quantiles and the histogram come from a fixed fine histogram, accurate to 0.83% of
``|x| + 0.001`` (see :mod:`capinterp.cards._act_stats`).

Under ``torchrun`` the texts are sharded by rank and the ranks' top-k buffers and statistics
merged (all-gather; float64 all-reduce), so every rank returns the one-process result.
"""

from __future__ import annotations

import functools
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from capinterp.arch.model import move_model, neuron_hook
from capinterp.cards._act_stats import RunningStats
from capinterp.cards._act_stream import Plan, encode_texts, read_batch, stream
from capinterp.cards._act_topk import RunningTopK
from capinterp.core import distributed as dist
from capinterp.core import validate
from capinterp.core.protocol import Model
from capinterp.units.neuron_set import NeuronSet

__all__ = ["ActivationStats", "Context", "UnitActivations", "activation_stats", "top_contexts"]


@dataclass(frozen=True)
class Context:
    """One top-activating context of one unit."""

    text_index: int  #: which text
    position: int  #: token position in that text's ids (BOS counted where the model's tokenizer adds one)
    activation: float  #: the unit's activation at that token
    tokens: tuple[str, ...]  #: the snippet's tokens (decoded one by one), a window around ``position``
    values: tuple[float, ...]  #: the unit's activation at each snippet token
    focus: int  #: index of ``position`` inside ``tokens``


@dataclass(frozen=True)
class ActivationStats:
    """One unit's activation distribution over all real (unpadded) tokens of some texts."""

    count: int
    mean: float
    std: float
    max: float
    min: float
    quantiles: dict[float, float]  #: 0.5, 0.9, 0.99, 0.999 (to 0.83% of |x| + 0.001)
    frac_positive: float
    histogram: tuple[tuple[float, ...], tuple[int, ...]]  #: (bin edges, counts): 40 equal bins on [min, max]


@dataclass(frozen=True)
class UnitActivations:
    """A unit's top contexts (highest first, at most one per (text, position)) and its statistics."""

    unit: tuple[int, int]  #: (layer, neuron)
    contexts: tuple[Context, ...]
    stats: ActivationStats


def top_contexts(
    model: Model,
    neurons: Any,
    texts: Sequence[str],
    *,
    k: int = 10,
    window: int = 8,
    batch_size: int = 8,
    max_tokens: int | None = None,
    hook: Callable[[int], str] | None = None,
    device: Any = None,
    progress: bool = True,
) -> list[UnitActivations]:
    """Each neuron's ``k`` top activating contexts over ``texts`` and its activation statistics.

    ``neurons``: a :class:`NeuronSet` (its neurons in sorted order), ``(layer, neuron)`` pairs or an
    int tensor ``[n, 2]``; results in that order. ``window``: tokens each side of a context's
    position in its snippet. ``max_tokens``: truncate each text (a text longer than the model's
    context is a ValueError otherwise). ``hook``: layer -> hook name whose last axis holds the
    units (default the neurons, ``blocks.{l}.mlp.hook_post``). ``device``: move the model there
    first (None: where it is).
    """
    k = validate.positive_int("k", k)
    window = validate.nonneg_int("window", window)
    units, ids, plan = _prepare(model, neurons, texts, batch_size, max_tokens, hook, device)
    return collect(model, units, ids, lambda t: read_batch(model, plan, t), k, window, batch_size, progress)


def collect(
    model: Model,
    units: Sequence[tuple[int, int]],
    ids: list[list[int]],
    read: Callable[[torch.Tensor], torch.Tensor],
    k: int,
    window: int,
    batch_size: int,
    progress: bool,
    desc: str = "top contexts",
) -> list[UnitActivations]:
    """Stream ``ids`` through ``read`` (``tokens -> [B, T, len(units)]``), keep each unit's running
    top ``k`` and statistics, merge the ranks, and build the :class:`UnitActivations`."""
    dev = torch.device(model.cfg.device)
    best = RunningTopK(len(units), k, window, dev)
    stats = RunningStats(len(units), dev)
    for acts, real, text_index in stream(model, ids, read, batch_size, progress, desc):
        best.add(acts, real, text_index)
        stats.add(acts[real])
    best.merge_ranks()
    stats.merge_ranks()
    decode = functools.lru_cache(maxsize=None)(lambda t: model.tokenizer.decode([t]))  # each token id once
    out = []
    for j, (unit, summary) in enumerate(zip(units, stats.summaries())):
        contexts = tuple(
            _context(model.tokenizer, ids[t], t, p, v, around, window, decode) for v, t, p, around in best.kept(j)
        )
        out.append(UnitActivations(unit, contexts, ActivationStats(**summary)))
    return out


def activation_stats(
    model: Model,
    neurons: Any,
    texts: Sequence[str],
    *,
    batch_size: int = 8,
    max_tokens: int | None = None,
    device: Any = None,
    progress: bool = False,
) -> list[ActivationStats]:
    """Each neuron's activation distribution over every real token of ``texts`` (see :func:`top_contexts`)."""
    units, ids, plan = _prepare(model, neurons, texts, batch_size, max_tokens, None, device)
    stats = RunningStats(len(units), torch.device(model.cfg.device))
    for acts, real, _ in stream(model, ids, lambda t: read_batch(model, plan, t), batch_size, progress):
        stats.add(acts[real])
    stats.merge_ranks()
    return [ActivationStats(**summary) for summary in stats.summaries()]


def _prepare(model, neurons, texts, batch_size, max_tokens, hook, device):
    """Every argument checked and the texts tokenized, before any forward."""
    validate.model(model)
    validate.positive_int("batch_size", batch_size)
    if max_tokens is not None:
        validate.positive_int("max_tokens", max_tokens)
    if hook is not None and not callable(hook):
        raise TypeError(f"hook must be a function layer -> hook name, got {hook!r}")
    validate.device("device", device)
    units = resolve_neurons(model, neurons, check_width=hook is None)
    texts = _check_texts(texts)
    ids = encode_texts(model, texts, max_tokens)
    move_model(model, device)
    dist.init(model.cfg.device)
    return units, ids, Plan(units, hook or neuron_hook, torch.device(model.cfg.device))


def _check_texts(texts: Any) -> list[str]:
    if isinstance(texts, str):
        raise TypeError("texts must be a list of strings, not one string: pass [text]")
    try:
        texts = list(texts)
    except TypeError:
        raise TypeError(f"texts must be a list of strings, got {type(texts).__name__}") from None
    if not texts:
        raise ValueError("texts is empty: give at least one text")
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise TypeError(f"texts[{i}] is {type(t).__name__}, not a string")
    return texts


def resolve_neurons(model: Model, neurons: Any, *, check_width: bool = True) -> list[tuple[int, int]]:
    """``(layer, neuron)`` pairs from a NeuronSet (sorted), pairs or an int tensor ``[n, 2]``; checked
    against the model's layers (and width, for neurons); ValueError when there are none."""
    if isinstance(neurons, NeuronSet):
        pairs = list(neurons)
    elif isinstance(neurons, torch.Tensor):
        if neurons.ndim != 2 or neurons.shape[1] != 2 or neurons.dtype.is_floating_point or neurons.dtype == torch.bool:
            raise ValueError(f"a neurons tensor must be integer [n, 2], got {neurons.dtype} {tuple(neurons.shape)}")
        pairs = [(int(a), int(b)) for a, b in neurons.tolist()]
    else:
        try:
            pairs = [_pair(p) for p in neurons]
        except (TypeError, ValueError):
            raise TypeError(
                f"neurons must be a NeuronSet, (layer, neuron) pairs or an int tensor [n, 2], got {neurons!r:.80}"
            ) from None
    if not pairs:
        raise ValueError("no neurons given: pass at least one (layer, neuron)")
    n_layers, d_mlp = int(model.cfg.n_layers), int(model.cfg.d_mlp)
    for layer, idx in pairs:
        if not 0 <= layer < n_layers or idx < 0 or (check_width and idx >= d_mlp):
            raise ValueError(f"neuron ({layer}, {idx}) is out of range: the model has {n_layers} layers of {d_mlp}")
    return pairs


def _pair(p: Any) -> tuple[int, int]:
    a, b = p
    if any(isinstance(x, bool) or not isinstance(x, numbers.Integral) for x in (a, b)):
        raise TypeError
    return int(a), int(b)


def _context(
    tok: Any,
    ids: list[int],
    text: int,
    pos: int,
    value: float,
    around: list[float],
    window: int,
    decode: Callable[[int], str] | None = None,
) -> Context:
    """One Context from a top-k entry; ``decode``: token id -> text (a cache), else ``tok.decode([id])``."""
    start, stop = max(0, pos - window), min(len(ids), pos + window + 1)
    tokens = tuple((decode or (lambda t: tok.decode([t])))(t) for t in ids[start:stop])
    values = tuple(around[window - (pos - start) : window + (stop - pos)])
    return Context(text, pos, value, tokens, values, pos - start)
