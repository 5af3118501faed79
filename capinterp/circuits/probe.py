"""Which of the bridge's hooks a model's blocks really fire, and the graph routes that follow.

TransformerBridge's attention and block classes differ by family: some split q/k/v inputs per
head (``hook_q_input``), some give per-head outputs (``hook_result``), some capture the MLP's input
before its norm (``hook_mlp_in``). Accepting a flag is no proof that its hook fires (MPT and CodeGen
accept ``use_split_qkv_input`` and never fire the hooks; BLOOM's fire with another tensor than the
block's input), so one short forward pass with every candidate hook counted decides, once per
model (kept on the model); a q/k/v input hook counts only when it carries the block's input. :func:`routes` turns the
answer into how :func:`capinterp.circuits.forward.run_graph` reads each node:

* head outputs: ``hook_result``, else the output projection's input z split per head times the
  projection's weight slice (orientation from the family record), times the family's residual
  multiplier (Granite) - the same sum the block adds to the residual stream;
* the MLP slot: ``hook_mlp_in``, else the input of the MLP's own norm (``ln2.hook_in``), else, for
  a parallel block whose attention and MLP share one norm, the MLP's input rebuilt as
  ``ln1(slot)`` from the block's input; a layer with no norm before its MLP (NemotronH's mixer and attention
  layers) reads the residual at the MLP's own input;
* ``"layer"`` attention slots: ``ln1.hook_in`` (sequential blocks), the attention's own input where
  it reads the residual without a norm (post-norm layers: OLMo-Hybrid), or ``ln1(slot)`` fed to the
  attention's input (parallel blocks, where ln1's output also feeds the MLP).

Routes are chosen per layer: a hybrid model's layers differ (attention, a mixer, an FFN alone).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from capinterp.core.protocol import Model

__all__ = ["Routes", "fired_hooks", "routes", "splits_qkv"]

_CANDIDATES = (
    "hook_q_input",
    "hook_k_input",
    "hook_v_input",
    "attn.hook_result",
    "hook_mlp_in",
    "ln1.hook_in",
    "ln2.hook_in",
    "attn.hook_in",
    "attn.o.hook_in",
    "mlp.hook_in",
)
_FLAGS = ("use_attn_result", "use_split_qkv_input", "use_hook_mlp_in")


def _try_set(model: Model, flag: str, value: bool) -> bool:
    try:
        getattr(model, f"set_{flag}")(value)
    except (NotImplementedError, ValueError, AttributeError):
        return False
    return True


def fired_hooks(model: Model) -> frozenset[str]:
    """Block hook names (``"blocks.{l}.<name>"``) that fire with the graph flags on (probed once)."""
    cached = getattr(model, "_capinterp_graph_hooks", None)
    if isinstance(cached, frozenset):
        return cached
    before = {f: bool(getattr(model.cfg, f, False)) for f in _FLAGS + ("use_attn_in",)}
    if before["use_attn_in"]:
        _try_set(model, "use_attn_in", False)
    on = {f: _try_set(model, f, True) for f in _FLAGS}
    fired: set[str] = set()

    values: dict[str, torch.Tensor] = {}

    def seen(name: str) -> Any:  # the name asked for: hook.name is the aliased target's
        def fn(x: Any, hook: Any) -> None:
            fired.add(name)
            if name.endswith(("_input", "hook_resid_pre")):
                values[name] = x.detach().float()

        return fn

    names = [f"blocks.{l}.hook_resid_pre" for l in range(int(model.cfg.n_layers))] + [
        f"blocks.{l}.{c}"
        for l in range(int(model.cfg.n_layers))
        for c in _CANDIDATES
        if not (c.startswith("hook_") and c.endswith("_input") and not on["use_split_qkv_input"])
        and not (c == "attn.hook_result" and not on["use_attn_result"])
    ]
    hooks = [(n, seen(n)) for n in names if n in model.hook_dict]
    dev = next(model.parameters()).device
    try:
        with torch.no_grad():
            try:
                model.run_with_hooks(torch.tensor([[1, 2, 3]], device=dev), fwd_hooks=hooks)
            except NotImplementedError:  # the bridge accepts split q/k/v inputs, then its attention refuses them
                if not on["use_split_qkv_input"]:
                    raise
                _try_set(model, "use_split_qkv_input", False)
                on["use_split_qkv_input"] = False
                fired.clear()
                values.clear()
                hooks = [(n, f) for n, f in hooks if not (n.endswith("_input") and ".hook_" in n)]
                model.run_with_hooks(torch.tensor([[1, 2, 3]], device=dev), fwd_hooks=hooks)
    finally:
        for f in _FLAGS:
            if on[f] and not before[f]:
                _try_set(model, f, False)
        if before["use_attn_in"]:
            _try_set(model, "use_attn_in", True)
    for l in range(int(model.cfg.n_layers)):  # a q/k/v input hook must carry the block's input (BLOOM's does not)
        resid = values.get(f"blocks.{l}.hook_resid_pre")
        for k in "qkv":
            x = values.get(f"blocks.{l}.hook_{k}_input")
            if x is None or resid is None or (x - resid[:, :, None]).abs().max() > 1e-5 * resid.abs().max():
                fired.discard(f"blocks.{l}.hook_{k}_input")
    out = frozenset(fired)
    try:
        model._capinterp_graph_hooks = out
    except (AttributeError, TypeError):  # pragma: no cover - a model that refuses attributes
        pass
    return out


def _every_block(model: Model, name: str, layers: list[int] | None = None) -> bool:
    """Whether ``blocks.{l}.<name>`` fires in every layer (of ``layers``, default all)."""
    fired = fired_hooks(model)
    return all(f"blocks.{l}.{name}" in fired for l in (range(int(model.cfg.n_layers)) if layers is None else layers))


def splits_qkv(model: Model) -> bool:
    """Whether every block with attention fires per-head q/k/v input hooks (granularity ``"qkv"`` is possible)."""
    from capinterp.arch.model import attention_layers

    return all(_every_block(model, f"hook_{k}_input", attention_layers(model)) for k in "qkv")


@dataclass(frozen=True)
class Routes:
    """How :func:`~capinterp.circuits.forward.run_graph` reads head outputs and the slots it rebuilds.

    ``mlp`` and ``layer_attn`` give one route per layer (layers of a hybrid model differ): the hook
    whose tensor is the slot's input (``"hook_mlp_in"``, ``"ln2.hook_in"``, ``"ln1.hook_in"``; or
    ``"mlp.hook_in"`` / ``"attn.hook_in"`` where the module reads the residual without a norm of its
    own), ``"norm"`` (ln1(slot) fed to the module's input), or ``""`` (no route; layers without
    attention)."""

    result: str  # "result" (hook_result) | "z" (o_proj input x W_O slice)
    mlp: tuple[str, ...]
    layer_attn: tuple[str, ...]  # for granularity "layer"


def routes(model: Model, parallel: bool) -> Routes:
    """The routes this model's hooks allow (see the module docstring); NotImplementedError if none."""
    from capinterp.arch.family import family_of
    from capinterp.arch.model import attention_layers

    fam = family_of(model)
    att = attention_layers(model)
    if _every_block(model, "attn.hook_result", att):
        result = "result"
    elif _every_block(model, "attn.o.hook_in", att):
        result = "z"
    else:
        raise NotImplementedError(
            f"{fam.name}: knowledge circuits need per-head attention outputs, and this model's attention "
            "fires neither hook_result nor its output projection's input hook"
        )
    fired = fired_hooks(model)

    def has(l: int, sub: str) -> bool:
        return getattr(model.blocks[l], "submodules", {}).get(sub) is not None

    def mlp_route(l: int) -> str:
        if f"blocks.{l}.hook_mlp_in" in fired:
            return "hook_mlp_in"
        if has(l, "ln2") and f"blocks.{l}.ln2.hook_in" in fired:
            return "ln2.hook_in"
        if parallel and f"blocks.{l}.mlp.hook_in" in fired:
            return "norm"
        if not parallel and not has(l, "ln2") and f"blocks.{l}.mlp.hook_in" in fired:
            return "mlp.hook_in"  # no norm before the MLP (NemotronH's 0-wide one): it reads the residual
        raise NotImplementedError(f"{fam.name}: no hook gives the MLP's input residual on this model (layer {l})")

    def attn_route(l: int) -> str:
        if l not in att:
            return ""
        if not parallel and has(l, "ln1") and f"blocks.{l}.ln1.hook_in" in fired:
            return "ln1.hook_in"
        if not parallel and not has(l, "ln1") and f"blocks.{l}.attn.hook_in" in fired:
            return "attn.hook_in"  # post-norm attention (OLMo-Hybrid): it reads the residual itself
        if parallel and f"blocks.{l}.attn.hook_in" in fired:
            return "norm"
        return ""

    L = range(int(model.cfg.n_layers))
    return Routes(result, tuple(mlp_route(l) for l in L), tuple(attn_route(l) for l in L))
