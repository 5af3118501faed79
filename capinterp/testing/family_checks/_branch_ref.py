"""The reference side for Gemma 4's MoE layers: experts beside the dense MLP, each branch normalized.

A Gemma 4 MoE decoder layer computes ``N1(mlp(pre(r))) + N2(sum_e w_e(r) expert_e(pre2(r)))`` from
the residual ``r`` after attention (transformers' ``Gemma4TextDecoderLayer``; the router reads ``r``
itself). :func:`make_dense` gives such a layer of a plain transformers model a reference forward,
written here independently of :mod:`capinterp.arch.branch_experts`: a forward pre-hook on
``pre_feedforward_layernorm`` keeps ``r``; the dense MLP's forward computes *every* expert on *every*
token from transformers' own expert weights (router weight folded in, 0 where not routed), then the
dense MLP's neurons, and hands them to one module, :class:`BranchesDown`, which sums each branch's
value vectors and applies that branch's norm. The layer's own MoE branch is turned off
(``enable_moe_block``), so transformers' forward runs ``post(mlp(pre(r)))``.

:class:`BranchesDown` is the layer's down projection for the other checks (``_ref_down`` of the
decoder layer, found by :func:`._hf.mlp_down`): its input is the neurons, its ``weight`` the stacked
value vectors (experts', then the dense MLP's as the shared expert), its output the FFN's before
``post_feedforward_layernorm``. ``branch_sums`` are two identity modules on the routed and the
dense branch's sums (the norms' inputs), where ROME's value shift lands.
"""

from __future__ import annotations

import types
from typing import Any

import torch

from capinterp.testing.contract import require
from capinterp.testing.family_checks._hf import decoder_layers
from capinterp.testing.family_checks._moe_ref import ExpertsDown, _halves_gate, is_branched

__all__ = ["BranchesDown", "dense_branches", "is_branched", "make_dense"]


class BranchesDown(ExpertsDown):
    """``neurons [..., E d + d_dense] -> N2(routed neurons @ W_r) + N1(dense neurons @ W_d)``; ``weight``
    is :class:`._moe_ref.ExpertsDown`'s (the dense MLP as the shared expert)."""

    def __init__(self, layer: Any) -> None:
        super().__init__(layer, layer.mlp)
        self.branch_sums = (torch.nn.Identity(), torch.nn.Identity())  # (routed, dense): not submodules

    def forward(self, neurons: torch.Tensor, weights: torch.Tensor | None = None) -> torch.Tensor:
        layer = self._refs.block
        ex = layer.experts
        n_routed = ex.down_proj.shape[0] * ex.down_proj.shape[2]
        if weights is not None:  # an expert takes part only on the tokens routed to it
            d = ex.down_proj.shape[2]
            routed = (weights != 0).to(neurons.dtype).repeat_interleave(d, dim=-1).reshape(*neurons.shape[:-1], -1)
            neurons = torch.cat([neurons[..., :n_routed] * routed, neurons[..., n_routed:]], -1)
        w = self.weight.to(neurons.dtype)
        routed_sum = self.branch_sums[0](neurons[..., :n_routed] @ w[:n_routed])
        dense_sum = self.branch_sums[1](neurons[..., n_routed:] @ w[n_routed:])
        return layer.post_feedforward_layernorm_2(routed_sum) + layer.post_feedforward_layernorm_1(dense_sum)


def _keep(norm: Any, args: tuple) -> None:
    """Pre-hook of ``pre_feedforward_layernorm``: keeps its input ``r`` for the MLP call that follows."""
    object.__setattr__(norm, "_ref_in", args[0])


def _forward(mlp: Any, x: torch.Tensor) -> torch.Tensor:
    """The dense MLP's forward on ``x = pre(r)``: both branches' neurons from transformers' modules.
    (Reads its decoder layer through ``mlp._ref_layer``, never a closure, so a deep copy runs on its own weights.)"""
    layer = mlp._ref_layer
    ex, norm = layer.experts, layer.pre_feedforward_layernorm
    r = norm._ref_in
    require(r is not None and r.shape == x.shape, "pre_feedforward_layernorm did not run just before the MLP")
    object.__setattr__(norm, "_ref_in", None)
    flat = r.reshape(-1, r.shape[-1])
    _, top_w, top_i = layer.router(flat)
    n_exp = ex.down_proj.shape[0]
    dense_w = torch.zeros(flat.shape[0], n_exp, dtype=top_w.dtype).scatter_add(1, top_i, top_w)
    x2 = layer.pre_feedforward_layernorm_2(flat)
    acts = [ex._apply_gate(x2 @ ex.gate_up_proj[e].T) * dense_w[:, e : e + 1] for e in range(n_exp)]
    dense = mlp.act_fn(mlp.gate_proj(x)) * mlp.up_proj(x)
    neurons = torch.cat([torch.stack(acts, 1).reshape(*x.shape[:-1], -1).to(x.dtype), dense], -1)
    return layer._ref_down(neurons, dense_w.to(x.dtype))


@torch.no_grad()
def dense_branches(hf: Any, ids: torch.Tensor | None = None) -> Any:
    """:func:`make_dense` on every branched decoder layer of ``hf`` not yet rewritten (in place; returns
    ``hf``); ``ids`` (default: a few tokens) check that the logits stay transformers', to 1e-5."""
    layers = [m for m in decoder_layers(hf) if is_branched(m) and getattr(m, "_ref_down", None) is None]
    if not layers:
        return hf
    ids = torch.tensor([[1, 5, 9, 30, 7, 2]]) if ids is None else ids
    before = hf(ids).logits
    for layer in layers:
        make_dense(layer)
    err = (hf(ids).logits - before).abs().max().item()
    require(
        err <= 1e-5 * max(1.0, before.abs().max().item()),
        lambda: f"the branch reference changed the logits by {err:.3g}",
    )
    return hf


def make_dense(layer: Any) -> None:
    """Give a branched decoder layer (:func:`is_branched`) the reference forward, in place; the caller
    checks the logits (:func:`dense_branches`). Sets transformers' experts flags that :mod:`._moe_ref` reads (Gemma 4's experts
    keep ``gate_up_proj [E, 2 d, d_model]``, gate half first, and ``down_proj [E, d_model, d]``)."""
    ex = layer.experts
    for k, v in dict(is_transposed=False, has_gate=True, has_bias=False, is_concatenated=True).items():
        object.__setattr__(ex, k, v)
    object.__setattr__(ex, "_apply_gate", types.MethodType(_halves_gate, ex))
    object.__setattr__(layer, "_ref_shared", layer.mlp)
    object.__setattr__(layer, "_ref_down", BranchesDown(layer))
    object.__setattr__(layer.mlp, "_ref_layer", layer)
    object.__setattr__(layer.pre_feedforward_layernorm, "_ref_in", None)
    layer.pre_feedforward_layernorm.register_forward_pre_hook(_keep)
    layer.mlp.forward = types.MethodType(_forward, layer.mlp)
    layer.enable_moe_block = False
