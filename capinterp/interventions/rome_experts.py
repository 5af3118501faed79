"""ROME on a mixture-of-experts layer: the rank-one update of one expert's down projection.

An MoE layer's neurons are every expert's on one axis (:mod:`capinterp.arch.experts`), a neuron's
activation carrying its router weight and 0 on tokens not routed to its expert. ROME's key
covariance over that whole axis would be ``(n_experts * d_expert)^2`` (Mixtral 8x7B: 114688^2
entries), and the update would spread over every expert. Per-expert ROME keeps ROME's algebra on
one expert ``e``'s ``d_expert`` neurons:

* k*_e: expert e's part of k* (the subject's last token, averaged over the contexts; 0 in a context
  whose routing did not choose e);
* C_e = E[k_e k_e^T] over the corpus (:func:`~capinterp.interventions.second_moment.second_moment`
  with ``neurons=`` e's slice; tokens not routed to e add 0 keys, as they do to the full C);
* W_e' = W_e + delta (C_e^{-1} k*_e)^T / (k*_e^T C_e^{-1} k*_e), written into e's own down
  projection. The layer's output at k* moves by delta (the value optimisation is unchanged: delta
  is added to the layer's output), the other experts and the shared expert keep their weights.

The expert: ``expert=`` in :func:`~capinterp.interventions.rome.rome_edit`, or by default the one
that writes most at the subject, ``argmax_e ||W_e^T k*_e||`` over the routed experts (an expert the
subject was never routed to writes 0). ``expert="shared"`` edits the layer's shared expert instead
(Qwen2-MoE, DeepSeek, GLM, Granite 4.0's shared MLP, ...): the same algebra on its ``d_shared``
neurons, which every token runs (a sigmoid gate, Qwen2-MoE's, is folded into their activation).
A :class:`~capinterp.arch.dense_layers.DenseBlock` layer of a mixed model is a dense layer: no
expert there.
"""

from __future__ import annotations

import torch

from capinterp.arch.expert_weights import ExpertValues
from capinterp.arch.experts import DenseBlock, ExpertBlock, latent_layers
from capinterp.arch.family import UnsupportedFamily, family_of
from capinterp.arch.weights import down_projection
from capinterp.core import validate
from capinterp.core.protocol import Model

#: ``expert=`` naming a layer's shared expert.
SHARED = "shared"
Expert = int | str  # an expert index, or SHARED

__all__ = [
    "SHARED",
    "Expert",
    "check_expert",
    "choose_expert",
    "expert_layer",
    "expert_restore",
    "expert_slice",
    "expert_value",
    "expert_write",
    "has_shared_expert",
]


def expert_layer(model: Model, layer: int) -> bool:
    """Whether ``layer`` is a mixture-of-experts layer (not a dense model's, nor a mixed model's dense one)."""
    blocks = getattr(model, "capinterp_experts", None) or []
    return bool(blocks) and not isinstance(blocks[layer], DenseBlock)


def has_shared_expert(model: Model, layer: int) -> bool:
    """Whether ``layer`` is an MoE layer with a shared expert (``expert="shared"`` can edit it)."""
    return expert_layer(model, layer) and _block(model, layer).shared is not None


def check_expert(model: Model, layer: int, expert: Expert | None) -> None:
    """``expert`` is None on a dense layer; None, an expert index or ``"shared"`` (where the layer has a
    shared expert) on an MoE layer (before any work)."""
    if not expert_layer(model, layer):
        if expert is not None:
            raise ValueError(f"expert={expert!r} is for mixture-of-experts layers; layer {layer} is dense")
        return
    if isinstance(expert, str):
        if expert != SHARED:
            raise ValueError(f"expert must be an expert index, {SHARED!r} or None, got {expert!r}")
        if not has_shared_expert(model, layer):
            raise ValueError(f"expert={SHARED!r}: layer {layer} has no shared expert ({family_of(model).name})")
        return
    if expert is not None:
        moe = family_of(model).moe
        assert moe is not None
        validate.integer("expert", expert, low=0, high=moe.n_experts - 1)
    if layer in latent_layers(model):  # a routed expert's value vectors are fc2 @ its columns
        fam = family_of(model)
        raise UnsupportedFamily(
            f"{fam.name} ({fam.architecture}): ROME at layer {layer} would write a routed expert's value vectors, "
            "which in this latent MoE are fc2_latent_proj @ the expert's own columns (a d_model update is in reach "
            f"only within fc2's range); edit the shared expert (expert={SHARED!r}) or a dense layer"
        )


def expert_slice(model: Model, expert: Expert) -> slice:
    """Expert ``expert``'s neurons on its layer's neuron axis (the shared expert's follow the routed ones)."""
    moe = family_of(model).moe
    assert moe is not None
    if expert == SHARED:
        routed = moe.n_experts * moe.d_expert
        return slice(routed, routed + moe.d_shared)
    assert isinstance(expert, int)
    return slice(expert * moe.d_expert, (expert + 1) * moe.d_expert)


def _values(model: Model, layer: int, expert: Expert) -> torch.Tensor:
    """Expert ``expert``'s value vectors, ``[d_expert or d_shared, d_model]`` (a copy)."""
    block = _block(model, layer)
    if expert == SHARED:
        return block.shared_values()
    assert isinstance(expert, int)
    return block.expert_values(expert)


def _block(model: Model, layer: int) -> ExpertBlock:
    proj = down_projection(model, layer)
    assert isinstance(proj, ExpertValues) and isinstance(proj.spec, ExpertBlock), f"layer {layer} is no expert layer"
    return proj.spec


@torch.no_grad()
def expert_value(model: Model, layer: int, key: torch.Tensor, expert: Expert) -> torch.Tensor:
    """``W_e^T k_e``: what expert ``expert`` writes for its part of ``key`` (``[d_mlp]``), float32 on the CPU."""
    k = key[expert_slice(model, expert)].float().cpu()
    return k @ _values(model, layer, expert).float().cpu()


@torch.no_grad()
def choose_expert(model: Model, layer: int, key: torch.Tensor) -> int:
    """The expert that writes most at the key: ``argmax_e ||W_e^T k_e||`` over the routed experts."""
    moe = family_of(model).moe
    assert moe is not None
    writes = torch.stack([expert_value(model, layer, key, e).norm() for e in range(moe.n_experts)])
    if not bool(writes.gt(0).any()):
        raise ValueError(f"ROME at layer {layer}: the subject's last token writes through no expert (its key is 0)")
    return int(writes.argmax())


@torch.no_grad()
def expert_write(model: Model, layer: int, update: torch.Tensor, expert: Expert) -> torch.Tensor:
    """Add ``update`` (``[d_model, d_mlp]``, keys to values) to expert ``expert``'s value vectors, in its
    own weight; returns the old ones (``[d_expert, d_model]``) for :func:`expert_restore`."""
    columns = expert_slice(model, expert)
    old = _values(model, layer, expert)
    new = (old.float() + update[:, columns].T.to(old.device)).to(old.dtype)
    down_projection(model, layer).write_rows(torch.arange(columns.start, columns.stop), new)
    return old


@torch.no_grad()
def expert_restore(model: Model, layer: int, old: torch.Tensor, expert: Expert) -> None:
    columns = expert_slice(model, expert)
    down_projection(model, layer).write_rows(torch.arange(columns.start, columns.stop), old)
