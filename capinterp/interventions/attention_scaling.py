"""Attention's role in knowledge expression: the paper's knowledge-synapse (KS) experiment.

Chen et al. (ICLR 2025, Sec. 4) scale the attention scores that the answering
position pays to chosen key positions, the *knowledge synapses*, and measure how the answer
probability (and the knowledge neurons' activations) change:

    A[l, h, q, k] <- alpha * A[l, h, q, k]     for q = the last prompt token, k in KS   (Eq. 5)

In TransformerLens this is a hook on ``blocks.{l}.attn.hook_pattern`` (post-softmax, [batch,
head, query, key]). The scaled row is not renormalized by default (``renormalize=True`` divides
it by its new sum). KS choices (reconstruction (R): the paper's exact rule is not given):
``"subject"`` (the subject's tokens, ``meta["subject"]``), ``"top"`` (the ``k`` keys most attended
from the last position, mean over layers and heads), or an explicit list of positions. The
control arm scales the same number of other positions (seeded): "irrelevant synapses".

Position 0 is left out of both arms unless ``include_first=True``: it is the attention sink of
most LMs (BOS, or the first word where the model uses no BOS, as SmolLM2), which takes most of
many heads' attention, so scaling it rescales every head's output instead of re-routing
information; on SmolLM2 scaling it by 0 or 2 in all layers destroys any prediction. The last
position (the query itself) is never a key: positions outside ``[first, last)`` are dropped.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pandas as pd
import torch

from capinterp.arch.family import UnsupportedFamily, family_of, layer_kinds
from capinterp.arch.model import neuron_hook, require_attention_layers
from capinterp.arch.pattern_writes import require_pattern_writes
from capinterp.core import validate
from capinterp.core.example import Example
from capinterp.core.protocol import Model
from capinterp.core.tokens import encode, model_bos
from capinterp.interventions.edit_eval import next_token_probs
from capinterp.interventions.hooks import check_no_padding
from capinterp.kernels.tracing import subject_token_range
from capinterp.units.neurons import NeuronSet

__all__ = ["attention_scaling", "knowledge_synapses", "scale_attention"]

KeySpec = str | Sequence[int] | Callable[[Any, Example, list[int]], Sequence[int]]


def _layers(model: Model, layers: Sequence[int] | None) -> list[int]:
    attending = require_attention_layers(model, "attention scaling")
    n = int(model.cfg.n_layers)
    out = attending if layers is None else [int(l) for l in layers]
    if not out or any(not 0 <= l < n for l in out):
        raise ValueError(f"layers must be a non-empty subset of 0..{n - 1}, got {layers!r}")
    if other := [l for l in out if l not in attending]:
        fam = family_of(model)
        raise UnsupportedFamily(
            f"{fam.name} ({fam.architecture}): layers {other} have no softmax attention (this hybrid model's layers "
            f"include {layer_kinds(fam)}); attention scaling reaches only its attention layers, {attending}"
        )
    require_pattern_writes(model, out, "attention scaling")
    return out


@contextlib.contextmanager
def scale_attention(
    model: Model,
    keys: Sequence[int],
    factor: float,
    *,
    query: int = -1,
    layers: Sequence[int] | None = None,
    heads: Sequence[int] | None = None,
    renormalize: bool = False,
) -> Iterator[Any]:
    """Multiply the attention from position ``query`` to positions ``keys`` by ``factor``.

    Applies to every row of the batch (run one prompt at a time when positions differ), in the
    given ``layers`` (all by default) and ``heads`` (all). Hooks are removed on exit.
    """
    keys_t = torch.as_tensor(list(keys), dtype=torch.long)
    if keys_t.numel() and int(keys_t.min()) < 0:
        raise ValueError(f"key positions must be >= 0, got {list(keys)}")
    head_idx = None if heads is None else torch.as_tensor(list(heads), dtype=torch.long)

    def hook(pattern: torch.Tensor, hook) -> torch.Tensor:
        T = pattern.shape[-1]
        q = query % pattern.shape[-2]
        if keys_t.numel() and int(keys_t.max()) >= T:
            raise ValueError(f"key position {int(keys_t.max())} is beyond the sequence ({T} tokens)")
        if keys_t.numel() and int(keys_t.max()) > q:
            raise ValueError(f"key positions {list(keys)} come after the query position {q} (causal attention)")
        pattern = pattern.clone()
        h = slice(None) if head_idx is None else head_idx.to(pattern.device)
        row = pattern[:, h, q, :]
        row[..., keys_t.to(pattern.device)] *= factor
        if renormalize:
            row = row / row.sum(-1, keepdim=True).clamp_min(1e-12)
        pattern[:, h, q, :] = row
        return pattern

    names = [f"blocks.{l}.attn.hook_pattern" for l in _layers(model, layers)]
    with model.hooks(fwd_hooks=[(n, hook) for n in names]):
        yield model


def knowledge_synapses(
    model: Model, example: Example, which: KeySpec = "subject", k: int = 3, include_first: bool = False
) -> list[int]:
    """Key positions (in the model's token ids, BOS included) that form the KS of ``example``.

    May be empty (e.g. a one-token subject at position 0 when ``include_first=False``).
    """
    ids = encode(model, [example], max_target_tokens=1)[0].prompt_ids
    bos = len(model_bos(model))
    last = len(ids) - 1
    first = 0 if include_first else 1
    if callable(which):
        pos = [int(p) for p in which(model, example, ids)]
    elif isinstance(which, str):
        if which == "subject":
            subject = example.meta.get("subject")
            if not subject:
                raise ValueError(f"KS 'subject' needs meta['subject'] (prompt {example.prompt!r})")
            a, b = subject_token_range(model.tokenizer, example.prompt, subject, ids[bos:], offset=bos)
            pos = list(range(a, b))
        elif which == "top":
            pos = _top_attended(model, ids, k, max(bos, first))
        else:
            raise ValueError(f"unknown KS rule {which!r}; use 'subject', 'top', positions or a callable")
    else:
        pos = [int(p) for p in which]
    if any(not 0 <= p <= last for p in pos):
        raise ValueError(f"KS positions {pos} out of range 0..{last} for prompt {example.prompt!r}")
    return sorted(p for p in set(pos) if first <= p < last)


@torch.no_grad()
def _top_attended(model: Model, ids: list[int], k: int, skip: int) -> list[int]:
    """The ``k`` keys most attended from the last position (positions < ``skip`` and the last excluded)."""
    names = {f"blocks.{l}.attn.hook_pattern" for l in require_attention_layers(model, "the keys most attended")}
    _, cache = model.run_with_cache(torch.tensor([ids], device=model.cfg.device), names_filter=lambda n: n in names)
    att = torch.stack([cache[n][0, :, -1, :].float().mean(0) for n in names]).mean(0).cpu()
    att[:skip] = -1
    att[-1] = -1
    cand = int((att >= 0).sum())
    return sorted(att.topk(min(k, cand)).indices.tolist()) if cand else []


@torch.no_grad()
def _neuron_act(model: Model, ids: list[int], neurons: NeuronSet) -> float:
    """Sum of the neurons' activations at the last position."""
    box: list[float] = []
    hooks = []
    for layer in range(neurons.n_layers):
        idx = neurons.mask[layer].nonzero().flatten()
        if idx.numel():
            hooks.append(
                (neuron_hook(layer), lambda a, hook, idx=idx: box.append(float(a[0, -1, idx.to(a.device)].sum())))
            )
    model.run_with_hooks(torch.tensor([ids], device=model.cfg.device), fwd_hooks=hooks)
    return float(sum(box))


def attention_scaling(
    model: Model,
    examples: Sequence[Any],
    *,
    keys: KeySpec = "subject",
    factors: Sequence[float] = (0.0, 2.0),
    k: int = 3,
    layers: Sequence[int] | None = None,
    control: bool = True,
    seed: int = 0,
    renormalize: bool = False,
    include_first: bool = False,
    neurons: Sequence[NeuronSet] | NeuronSet | None = None,
) -> pd.DataFrame:
    """Scale the last position's attention to the KS (and to a random control) and measure it.

    Returns one row per (example, factor, arm) with ``arm`` "ks" or "control", ``n_keys``,
    ``p_before``/``p_after`` of the target's first token, ``delta`` and ``rel_delta``; with
    ``neurons`` (one set, or one per example) also the summed activation of those neurons at the
    last position before and after (``act_before``/``act_after``). An arm with no positions (empty
    KS, or too few other positions for the control) gets NaN. Inputs are checked first.
    """
    validate.model(model)
    exs = validate.examples(examples, "attention_scaling(examples)")
    if isinstance(factors, (str, bytes)) or not isinstance(factors, Sequence) or not factors:
        raise ValueError(f"factors must be a non-empty sequence of numbers, got {factors!r:.60}")
    for i, f in enumerate(factors):
        validate.finite_float(f"factors[{i}]", f)
    validate.positive_int("k", k)
    validate.integer("seed", seed)
    _layers(model, layers)
    sets = [neurons] * len(exs) if isinstance(neurons, NeuronSet) else (list(neurons) if neurons is not None else None)
    if sets is not None and len(sets) != len(exs):
        raise ValueError(f"neurons: {len(sets)} sets for {len(exs)} examples")
    for s in sets or []:
        check_no_padding(model, s)
    enc = encode(model, exs, max_target_tokens=1)
    ks = [knowledge_synapses(model, e, keys, k, include_first) for e in exs]
    rng, rows = random.Random(seed), []
    for i, (it, pos) in enumerate(zip(enc, ks)):
        ids, target = it.prompt_ids, it.target_ids[0]
        pool = [p for p in range(0 if include_first else 1, len(ids) - 1) if p not in pos]
        arms: dict[str, list[int] | None] = {"ks": pos}
        if control:
            arms["control"] = sorted(rng.sample(pool, len(pos))) if len(pool) >= len(pos) and pos else None
        p0 = float(next_token_probs(model, [ids])[0, target])
        a0 = _neuron_act(model, ids, sets[i]) if sets is not None else None
        for factor in factors:
            for arm, where in arms.items():
                row = {
                    "example": i,
                    "prompt": it.example.prompt,
                    "factor": float(factor),
                    "arm": arm,
                    "n_keys": len(where) if where is not None else 0,
                    "p_before": p0,
                }
                if where is None or not where:
                    row.update(p_after=float("nan"))
                else:
                    with scale_attention(model, where, float(factor), layers=layers, renormalize=renormalize):
                        row["p_after"] = float(next_token_probs(model, [ids])[0, target])
                        if sets is not None:
                            row.update(act_before=a0, act_after=_neuron_act(model, ids, sets[i]))
                rows.append(row)
    df = pd.DataFrame(rows)
    df["delta"] = df["p_after"] - df["p_before"]
    df["rel_delta"] = df["delta"] / df["p_before"].clip(lower=1e-12)
    return df
