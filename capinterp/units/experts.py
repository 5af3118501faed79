"""Experts as units: ``(layer, expert)`` keys of a mixture-of-experts model.

An MoE layer's neurons are flat on one axis (:mod:`capinterp.arch.experts`): expert ``e``'s
neuron ``i`` is ``e * d_expert + i``, the shared expert's neurons come last (its key is
``(layer, "shared")``). :func:`expert_scores` sums neuron scores per expert, :func:`top_experts`
keeps the best ``k`` as a :class:`~capinterp.units.base.KeySet` of kind ``"expert"``, and
:func:`expert_neurons` turns expert keys into the :class:`NeuronSet` of all their neurons, which
``erase`` / ``scale`` / ``finetune`` take: erasing an expert zeroes its output on the tokens
routed to it and keeps the routing (the other chosen experts keep their router weights).

A dense layer of a mixed dense / MoE model (DeepSeek's first_k_dense_replace: :func:`dense_layers`)
has no experts: its row of :func:`expert_scores` is 0, :func:`top_experts` never picks it (nor
counts it among the units), and an expert key naming it is a ValueError.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import cast

import torch
from torch import Tensor

from capinterp.arch.family import MoE, family_of
from capinterp.core.protocol import Model
from capinterp.units.base import KeySet
from capinterp.units.neurons import NeuronScores, NeuronSet

__all__ = [
    "dense_layers",
    "expert_columns",
    "expert_index",
    "expert_keys",
    "expert_neurons",
    "expert_scores",
    "expert_units",
    "moe_of",
    "top_experts",
]


def moe_of(model: Model) -> MoE:
    """The model's :class:`~capinterp.arch.family.MoE` record; a clear error on dense models."""
    fam = family_of(model)
    if fam.moe is None:
        raise ValueError(f"{fam.name} ({fam.architecture}) has dense FFNs: it has no experts")
    return fam.moe


def dense_layers(model: Model) -> list[int]:
    """The layers of a mixed dense / MoE model whose FFN is dense (no experts); [] on other models."""
    from capinterp.arch.experts import DenseBlock

    return [b.layer for b in getattr(model, "capinterp_experts", None) or () if isinstance(b, DenseBlock)]


def expert_keys(moe: MoE) -> list[Hashable]:
    """The expert indices of one layer: ``0 .. n_experts - 1``, then ``"shared"`` where there is one."""
    return [*range(moe.n_experts), *(["shared"] if moe.d_shared else [])]


def expert_scores(model: Model, scores: NeuronScores | Tensor, *, absolute: bool = False) -> Tensor:
    """``[n_layers, n_experts (+1 shared)]``: each expert's summed neuron scores (``absolute``: of |scores|).
    A dense layer of a mixed model (:func:`dense_layers`) has no experts: its row is 0."""
    moe = moe_of(model)
    s = scores.scores if isinstance(scores, NeuronScores) else torch.as_tensor(scores)
    if s.dim() != 2 or s.shape[1] != moe.width:
        raise ValueError(f"scores must be [n_layers, {moe.width}] for this model, got {tuple(s.shape)}")
    s = s.abs() if absolute else s
    routed = moe.n_experts * moe.d_expert
    per = s[:, :routed].reshape(s.shape[0], moe.n_experts, moe.d_expert).sum(-1)
    if moe.d_shared:
        per = torch.cat([per, s[:, routed:].sum(-1, keepdim=True)], dim=1)
    dense = dense_layers(model)
    if dense:
        per[dense] = 0.0
    return per


def _space(model: Model, moe: MoE) -> tuple:
    dense = tuple(dense_layers(model))
    return ("expert", int(model.cfg.n_layers), moe.n_experts, moe.d_shared > 0) + ((dense,) if dense else ())


def top_experts(model: Model, scores: NeuronScores | Tensor, k: int, *, absolute: bool = False) -> KeySet:
    """The ``k`` experts with the highest :func:`expert_scores`, as a KeySet of ``(layer, expert)``;
    only expert layers' experts are candidates (a mixed model's dense layers have none)."""
    moe = moe_of(model)
    per = expert_scores(model, scores, absolute=absolute)
    dense = set(dense_layers(model))
    layers = [l for l in range(per.shape[0]) if l not in dense]
    per = per[layers]
    if not 1 <= int(k) <= per.numel():
        raise ValueError(f"k must be in [1, {per.numel()}], got {k}")
    names = expert_keys(moe)
    flat = per.flatten().topk(int(k)).indices.tolist()
    keys = [(layers[i // per.shape[1]], names[i % per.shape[1]]) for i in flat]
    return KeySet(keys, "expert", _space(model, moe), n_units=per.numel())


def _checked_keys(
    model: Model, moe: MoE, experts: KeySet | Iterable[tuple[int, Hashable]]
) -> list[tuple[int, Hashable]]:
    """The ``(layer, expert)`` keys of ``experts``, each checked against the model's layers and experts."""
    n_layers = int(model.cfg.n_layers)
    if isinstance(experts, KeySet) and experts.kind != "expert":
        raise ValueError(f"expected a KeySet of kind 'expert', got kind {experts.kind!r}")
    keys = list(experts.keys() if isinstance(experts, KeySet) else experts)
    dense = dense_layers(model)
    for layer, e in keys:
        if not 0 <= int(layer) < n_layers:
            raise ValueError(f"layer {layer} out of range for a model with {n_layers} layers")
        if int(layer) in dense:
            raise ValueError(
                f"layer {layer} is a dense layer of this mixed dense / MoE model: it has no experts "
                f"(its expert layers are {[l for l in range(n_layers) if l not in dense]})"
            )
        if e == "shared":
            if not moe.d_shared:
                raise ValueError("this model has no shared expert")
        elif not (isinstance(e, int) and 0 <= e < moe.n_experts):
            raise ValueError(f"expert {e!r} is not one of 0..{moe.n_experts - 1}{' or shared' if moe.d_shared else ''}")
    return keys


def expert_neurons(model: Model, experts: KeySet | Iterable[tuple[int, Hashable]]) -> NeuronSet:
    """Every neuron of the given ``(layer, expert)`` keys (``"shared"`` for the shared expert)."""
    moe = moe_of(model)
    keys = _checked_keys(model, moe, experts)
    mask = torch.zeros(int(model.cfg.n_layers), moe.width, dtype=torch.bool)
    routed = moe.n_experts * moe.d_expert
    for layer, e in keys:
        if e == "shared":
            mask[layer, routed:] = True
        else:
            e = int(cast(int, e))
            mask[layer, e * moe.d_expert : (e + 1) * moe.d_expert] = True
    from capinterp.arch.model import model_meta

    return NeuronSet(mask, meta={**model_meta(model), "experts": sorted(map(str, keys))})


def expert_columns(moe: MoE) -> Tensor:
    """``[width]``: each neuron's expert column in :func:`expert_scores` (the shared expert's is the last)."""
    routed = torch.arange(moe.n_experts).repeat_interleave(moe.d_expert)
    return torch.cat([routed, torch.full((moe.d_shared,), moe.n_experts)])


def expert_units(model: Model) -> Tensor:
    """Flat indices ``layer * n_columns + column`` (the layout of :func:`expert_scores` flattened) of
    every expert of the model, in order: all of them, but a mixed model's dense layers' columns
    (they hold no expert). Its length is the number of expert units."""
    moe = moe_of(model)
    cols, dense = len(expert_keys(moe)), set(dense_layers(model))
    layers = [l for l in range(int(model.cfg.n_layers)) if l not in dense]
    return (torch.tensor(layers, dtype=torch.long)[:, None] * cols + torch.arange(cols)).flatten()


def expert_index(model: Model, experts: KeySet | Iterable[tuple[int, Hashable]]) -> Tensor:
    """Flat indices ``layer * n_columns + column`` of ``(layer, expert)`` keys, in the layout of
    :func:`expert_scores` flattened (checked as :func:`expert_neurons` checks them)."""
    moe = moe_of(model)
    keys = _checked_keys(model, moe, experts)
    names = expert_keys(moe)
    return torch.tensor(sorted(int(layer) * len(names) + names.index(e) for layer, e in keys), dtype=torch.long)
