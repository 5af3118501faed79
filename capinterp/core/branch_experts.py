"""Experts beside a dense MLP, each branch normalized before the two add (Gemma 4's MoE layers).

Gemma 4's MoE decoder layer (26B-A4B) computes its FFN from the residual ``r`` after attention as

    ffn(r) = N1(mlp(pre(r))) + N2(sum_e w_e(r) * expert_e(pre2(r)))

(``pre`` / ``pre2``: ``pre_feedforward_layernorm`` / ``_2``; ``N1`` / ``N2``: ``post_feedforward_layernorm_1``
/ ``_2``; the router reads ``r`` itself), then ``post_feedforward_layernorm`` and the residual add.
capinterp serves it as one MoE layer whose neuron axis is the routed experts' neurons, router weight
folded in (:mod:`capinterp.core.experts`), then the dense MLP's as the layer's shared expert. Each
branch's output is the sum of its neurons' value vectors; the layer's is not (the two norms come
between): editing a value vector moves its branch's output, which the norm then rescales.

How it is served: the dense MLP's forward becomes the expert block's, which computes both branches
and their norms (the bridge's ``router``, ``pre_feedforward_layernorm_2`` and
``post_feedforward_layernorm_1`` / ``_2`` components, so their hooks fire). The MLP is handed
``pre(r)``; ``r`` itself is what ``pre_feedforward_layernorm``'s transformers module reads, after the
bridge's ``ln2.hook_in`` (a patched MLP slot reaches both branches), and that module hands it on
through a :class:`ResidualTap`. The decoder layer's ``enable_moe_block`` is turned off, so its own
forward runs ``post(mlp(pre(r)))`` with ``mlp`` the whole FFN. At load the model's logits are
compared with transformers' own forward on random tokens; any difference refuses the model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from capinterp.core.family import UnsupportedFamily
from capinterp.core.gated_mlp import unwrap

__all__ = ["NormedBranches", "ResidualTap", "branch_layer", "check_logits", "normed_branches", "probe_logits"]

_NORMS = ("pre_feedforward_layernorm_2", "post_feedforward_layernorm_1", "post_feedforward_layernorm_2")


class ResidualTap:
    """The input of a layer's pre-MLP norm, kept for the MLP's forward that follows it in the same
    layer call (the norm's transformers module reads the slot after the bridge's ``hook_in``)."""

    def __init__(self, layer: int, norm_forward: Any) -> None:
        self.layer, self.norm_forward = layer, norm_forward
        self.value: Tensor | None = None

    def __call__(self, x: Tensor, *args: Any, **kwargs: Any) -> Tensor:
        self.value = x
        return self.norm_forward(x, *args, **kwargs)

    def take(self, like: Tensor) -> Tensor:
        """The residual the MLP's input ``like`` was normalized from (handed on once)."""
        r, self.value = self.value, None
        if r is None or r.shape != like.shape:
            raise RuntimeError(
                f"layer {self.layer}'s experts read the residual before pre_feedforward_layernorm, which did not "
                "run just before this MLP call: call the decoder layer (or the model), not its MLP on its own"
            )
        return r


@dataclass(frozen=True, eq=False)
class NormedBranches:
    """The modules around the two branches (bridge components: their hooks fire)."""

    tap: ResidualTap
    pre2: Any  # pre_feedforward_layernorm_2: the experts' input norm
    post_dense: Any  # post_feedforward_layernorm_1: after the dense MLP
    post_experts: Any  # post_feedforward_layernorm_2: after the routed sum


def branch_layer(model: Any, layer: int) -> bool:
    """Whether ``layer``'s decoder layer runs experts beside its dense MLP, normalized apart (Gemma 4)."""
    raw = unwrap(model.blocks[layer])
    return bool(getattr(raw, "enable_moe_block", False)) and all(hasattr(raw, n) for n in _NORMS + ("experts",))


def normed_branches(model: Any, layer: int, where: str) -> NormedBranches:
    """The branch norms of ``layer``, the pre-MLP norm tapped; refused where the bridge maps them not."""
    block = model.blocks[layer]
    mods = [getattr(block, n, None) for n in _NORMS]
    missing = [n for n, m in zip(_NORMS, mods) if m is None] + ([] if hasattr(block, "ln2") else ["ln2"])
    if missing:
        raise UnsupportedFamily(f"{where}: the bridge maps no {', '.join(missing)} of the expert layer")
    norm = unwrap(block.ln2)
    tap = norm.forward if isinstance(norm.forward, ResidualTap) else ResidualTap(layer, norm.forward)
    return NormedBranches(tap, *mods)


def serve(model: Any, layer: int, branches: NormedBranches) -> None:
    """Tap the pre-MLP norm and let the decoder layer's forward skip its own MoE branch."""
    unwrap(model.blocks[layer].ln2).forward = branches.tap
    unwrap(model.blocks[layer]).enable_moe_block = False


def probe_logits(model: Any) -> Tensor:
    """transformers' logits on a fixed random batch (checked again after capinterp serves the layers)."""
    hf = model.original_model
    p = next(hf.parameters())
    ids = torch.randint(0, int(model.cfg.d_vocab), (2, 7), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        return hf(input_ids=ids.to(p.device)).logits.float()


def check_logits(model: Any, want: Tensor, where: str) -> None:
    """Refuse where capinterp's forward of the branch layers changed transformers' logits."""
    got = probe_logits(model)
    eps = torch.finfo(next(model.original_model.parameters()).dtype).eps
    err, tol = float((got - want).abs().max()), max(1e-4, 64 * eps) * max(1.0, float(want.abs().max()))
    if not err <= tol:
        raise UnsupportedFamily(
            f"{where}: with the experts and the dense MLP served as one neuron axis the logits differ from "
            f"transformers' by {err:.3g} (tolerance {tol:.3g}); the layer takes a step capinterp does not know"
        )
