"""Experts beside a dense MLP, each branch normalized before the two add (Gemma 4's MoE layers).

Gemma 4's MoE decoder layer (26B-A4B) computes its FFN from the residual ``r`` after attention as

    ffn(r) = N1(mlp(pre(r))) + N2(sum_e w_e(r) * expert_e(pre2(r)))

(``pre`` / ``pre2``: ``pre_feedforward_layernorm`` / ``_2``; ``N1`` / ``N2``: ``post_feedforward_layernorm_1``
/ ``_2``; the router reads ``r`` itself), then ``post_feedforward_layernorm`` and the residual add.
capinterp serves it as one MoE layer whose neuron axis is the routed experts' neurons, router weight
folded in (:mod:`capinterp.arch.experts`), then the dense MLP's as the layer's shared expert. Each
branch's output is the sum of its neurons' value vectors; the layer's is not (the two norms come
between): editing a value vector moves its branch's output, which the norm then rescales.

How it is served: the dense MLP's forward becomes the expert block's, which computes both branches
and their norms (the bridge's ``router``, ``pre_feedforward_layernorm_2`` and
``post_feedforward_layernorm_1`` / ``_2`` components, so their hooks fire). The MLP is handed
``pre(r)``; ``r`` itself is what ``pre_feedforward_layernorm``'s transformers module reads, after the
bridge's ``ln2.hook_in`` (a patched MLP slot reaches both branches), and that module hands it on
through a :class:`ResidualTap`. The decoder layer's ``enable_moe_block`` is turned off, so its own
forward runs ``post(mlp(pre(r)))`` with ``mlp`` the whole FFN. At load the model's logits are
compared with transformers' own, layer by layer, on what transformers' forward of random tokens gives
it; any difference refuses the model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from capinterp.arch.family import UnsupportedFamily
from capinterp.arch.gated_mlp import unwrap

__all__ = ["NormedBranches", "ResidualTap", "branch_layer", "check", "normed_branches", "probe", "serve"]

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


_PROBE = torch.randint(0, 2**62, (2, 7), generator=torch.Generator().manual_seed(0))  # token ids, mod the vocabulary


def _forward(model: Any, layers: list[int], given: dict[int, Tensor] | None = None) -> dict[int, tuple[Tensor, Tensor]]:
    """``{layer: (r, ffn(r))}`` from a forward of transformers' model on a fixed random batch: the residual
    the pre-MLP norm reads and the FFN's output (the post-FFN norm's input); with ``given``, each layer's
    pre-MLP norm reads ``given[layer]`` instead (every layer on the same input as before, nothing compounding)."""
    seen: dict[int, list[Tensor]] = {l: [] for l in layers}
    hooks = []

    def keep(l: int, replace: bool) -> Any:
        def hook(_m: Any, args: tuple) -> tuple | None:
            seen[l].append(args[0].detach())
            return (given[l], *args[1:]) if replace and given is not None else None

        return hook

    for l in layers:
        hooks.append(unwrap(model.blocks[l].ln2).register_forward_pre_hook(keep(l, True)))
        hooks.append(unwrap(model.blocks[l].ln2_post).register_forward_pre_hook(keep(l, False)))
    hf = model.original_model
    ids = (_PROBE % int(model.cfg.d_vocab)).to(next(hf.parameters()).device)
    try:
        with torch.no_grad():
            hf(input_ids=ids)
    finally:
        for h in hooks:
            h.remove()
    return {l: (given[l] if given is not None else v[0], v[-1]) for l, v in seen.items()}


def probe(model: Any, layers: list[int]) -> dict[int, tuple[Tensor, Tensor]]:
    """What transformers computes in ``layers`` before capinterp serves them (:func:`check`)."""
    return _forward(model, layers)


def check(model: Any, probed: dict[int, tuple[Tensor, Tensor]], where: str) -> None:
    """Refuse where a served layer's FFN, run by its decoder layer on the residual transformers' forward
    gave it, differs from transformers' (layer by layer: in bfloat16 a whole forward compounds rounding
    into flipped routing choices)."""
    now = _forward(model, list(probed), {l: r for l, (r, _) in probed.items()})
    for l, (_, want) in probed.items():
        got = now[l][1]
        eps = torch.finfo(want.dtype).eps
        err, tol = float((got - want).abs().max()), max(1e-4, 16 * eps) * max(1.0, float(want.abs().max()))
        if not err <= tol:
            raise UnsupportedFamily(
                f"{where}: layer {l}'s FFN, served as one neuron axis of experts and dense MLP, differs from "
                f"transformers' by {err:.3g} (tolerance {tol:.3g}); the layer takes a step capinterp does not know"
            )
