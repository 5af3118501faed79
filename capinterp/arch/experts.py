"""Mixture-of-experts FFNs as neurons: ``(layer, expert, neuron)`` units on one neuron axis per layer.

A sparse MoE layer routes each token to ``top_k`` of ``n_experts`` experts and sums their
outputs weighted by the router: ``out = sum_e w_e(x) * down_e(act_e(x))``. capinterp gives
the layer one neuron axis, ``n_experts * d_expert`` wide (expert ``e``'s neuron ``i`` is
flat neuron ``e * d_expert + i``), followed by the shared expert's neurons where the family
has one (Qwen2-MoE; its sigmoid gate plays the router weight). A neuron's activation is

    a[e, i] = w_e(x) * act_e(x)[i]   on tokens routed to expert e,   0 on the others,

the router weight folded in, so the layer's output is exactly ``sum_f a[f] * W_out[f]`` (plus
gpt-oss's expert biases, weighted by the router and owned by no neuron): the dense-FFN picture
every method relies on (value vectors, DCSN's projection, erasure, masks on owned weights).
The router weight stays in the gradient path: attributions to ``a`` are attributions to
``w_e * act_e`` (scaling one scales the other), and later layers' routers see the change.
Where the router weight scales the expert's *input* instead (Llama 4), a neuron is
``act_e(w_e(x) * x)[i]`` on routed tokens, 0 elsewhere: the output is still ``sum_f a[f] * W_out[f]``.
Routing is decided on the layer's input before the neurons' hook runs, so writing a value into
the neurons of an expert a token was not routed to has no effect on that token: an expert
takes part only where the router sent the token. Erasing a neuron or a whole expert zeroes
its output and keeps the routing (the other chosen experts keep their weights).

:func:`install` replaces each MoE block's forward of a loaded ``TransformerBridge`` by one that
computes exactly the transformers block's output (experts read through transformers' own flags:
``has_gate``, ``has_bias``, ``is_transposed``, ``_apply_gate``, so Mixtral, Qwen2/3-MoE, OLMoE
and gpt-oss share one path) and exposes the neurons at ``blocks.{l}.mlp.hook_post``
(``[batch, pos, n_experts * d_expert + d_shared]``), TransformerLens' name for an MLP's
neurons; the block's output stays at ``hook_out``. How the block calls its router is read from
the modules (extra router arguments by name from the block, such as an expert score bias; rows or
``[batch, pos, d_model]`` input; whether its weight goes on the experts' outputs or inputs; its
output as top-k weights and indices, or as scores over all experts like Llama 4's). Experts that
store gated stacked weights without transformers' flags (Llama 4) are read with the orientation
their shapes give, and so are JetMoE's two ``ParallelExperts`` modules (its router returns its
choices grouped by expert; its block adds a bias to its output, owned by no neuron); a shared
expert the config does not name (Llama 4's) is taken from the modules. Granite 4.0's shared MLP, which
its decoder layer adds beside the MoE block (one fused ``input_linear`` [gate | up]), joins the block's
forward as its shared expert, and that module's own forward then returns 0 (the layer's output is unchanged).
DeepSeek-V4's hash layers route by the token ids, which its decoder layer hands the block and the
forward passes to the router. NemotronH's latent experts read ``fc1(x)`` and write through ``fc2``: a
routed neuron's value vector is ``fc2 @`` its column (writable only within fc2's range).
At load each layer's forward is checked against the
transformers block's own on random inputs (100 times larger where the experts clamp their inputs, so
the clamps bite). What cannot be served this way (a layer without an FFN,
experts normalized after the down projection, an experts module without transformers' stacked
weights, a block that routes by more than its input and the token ids, any block whose output the
check finds different) is refused at load with the reason.

Gemma 4's MoE layers run their experts beside a dense MLP, each branch normalized before the two add:
served here with the dense MLP as the shared expert and the branch norms in the forward
(:mod:`capinterp.arch.branch_experts`).

Dense layers among MoE layers (the released DeepSeek-V2/V3, GLM-4 MoE, Ernie 4.5 MoE, AFMoE and
Laguna checkpoints: dense layers first; Llama 4 Maverick's interleaving) are served on the same neuron
axis by :class:`~capinterp.arch.dense_layers.DenseBlock` (their neurons first, then padding that is
always 0), and so is a dense model whose layers differ in width (NemotronH's mixer layers have an FFN
with no neurons, :mod:`capinterp.arch.one_sublayer`).
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor

from capinterp.arch.branch_experts import NormedBranches, branch_layer, normed_branches
from capinterp.arch.branch_experts import check as check_branches
from capinterp.arch.branch_experts import probe as probe_branches
from capinterp.arch.branch_experts import serve as serve_branches
from capinterp.arch.dense_layers import DenseBlock, dense_block
from capinterp.arch.family import FFN_ONLY_LAYERS, Family, MoE, NeuronAxis, UnsupportedFamily, family_of
from capinterp.arch.gated_mlp import (
    FusedNames,
    fused_gated,
    input_projections,
    is_mlp,
    mlp_neurons,
    module_of,
    named_gated,
    unwrap,
)
from capinterp.core.protocol import Model

__all__ = ["DenseBlock", "ExpertBlock", "branched", "expert_block", "install", "is_moe", "latent_layers"]

_HOOK = "hook_neurons"  # the HookPoint's own name; blocks.{l}.mlp.hook_post is its alias


@dataclass(frozen=True, eq=False)
class ExpertBlock:
    """One MoE layer's modules: the routed experts, the router, the optional shared expert."""

    layer: int
    # transformers modules, typed Any: their attributes are read by transformers' own names
    block: Any  # the transformers sparse-MoE block
    router: Any  # as the block holds it (the bridge's wrapper: its hooks still fire)
    experts: Any  # transformers' stacked experts (3-D parameters, has_gate / has_bias / is_transposed flags)
    shared: Any  # shared expert MLP (gate_proj / up_proj / down_proj; NemotronH's plain up_proj / down_proj), or None
    shared_gate: Any  # its sigmoid gate (Linear d_model -> 1), or None
    n_experts: int
    d_expert: int
    d_shared: int
    returns_scores: bool  # the block returns (output, router scores) (gpt-oss)
    router_args: tuple[str, ...] = ()  # block attributes the router takes after the hidden states (a score bias)
    # the router takes the token ids after the hidden states (DeepSeek-V4's hash layers: a fixed token id ->
    # experts table picks the experts, the learned gate only weights them); the block is called with them
    by_token: bool = False
    router_3d: bool = False  # the router reads [batch, pos, d_model], not one row per token
    # the router weight scales the expert's input, not its output (Llama 4): a neuron is then
    # act_e(w * x)[i], still 0 on tokens not routed to its expert, and the layer's output is still
    # the sum over neurons of a * W_out
    input_weighted: bool = False
    top_k: int = 0  # experts per token: read from the router's scores where it returns them over all experts
    out_bias: Any = None  # a bias the block adds to its output (JetMoE's), owned by no neuron
    # the transformers module of a shared expert the decoder layer adds beside the block (Granite 4.0's
    # shared_mlp): the block's forward then computes it too, and this module's own forward returns 0
    shared_beside: Any = None
    # NemotronH's latent MoE (Nemotron 3 Super): the routed experts read fc1(x) and their summed output
    # goes through fc2 (both Linears, d_model <-> latent): a routed neuron's value vector is fc2 @ its
    # column of the expert's down projection; the router and the shared expert read x itself
    latent: tuple[Any, Any] | None = None
    # Gemma 4: the experts run beside the dense MLP (the shared expert here), each branch normalized
    # before the two add, the router reading the residual the MLP's norm reads (branch_experts)
    branches: NormedBranches | None = None

    # ---- the experts' arithmetic, read from transformers' own flags

    def _proj(self, x: Tensor, w: Tensor, b: Tensor | None) -> Tensor:
        y = x @ w if self.experts.is_transposed else x @ w.T
        return y if b is None else y + b

    def activation(self, e: int, x: Tensor) -> Tensor:
        """``act_e(x)``: expert ``e``'s neurons on rows ``x`` (``[n, d_model] -> [n, d_expert]``)."""
        ex = self.experts
        if ex.has_gate:
            h = self._proj(x, ex.gate_up_proj[e], ex.gate_up_proj_bias[e] if ex.has_bias else None)
            return ex._apply_gate(h)
        h = self._proj(x, ex.up_proj[e], ex.up_proj_bias[e] if ex.has_bias else None)
        return ex.act_fn(h)

    def down(self, e: int, a: Tensor) -> Tensor:
        """Expert ``e``'s down projection of neurons ``a``, without its bias."""
        return self._proj(a, self.experts.down_proj[e], None)

    def down_bias(self, e: int) -> Tensor | None:
        return self.experts.down_proj_bias[e] if self.experts.has_bias else None

    def _to_model(self, rows: Tensor) -> Tensor:
        """Routed value rows as the residual stream receives them: through fc2 in a latent MoE."""
        return rows if self.latent is None else rows @ self.latent[1].weight.T.to(rows.dtype)

    def _own_rows(self) -> Tensor:
        """The routed experts' down-projection columns, one row per neuron, in the experts' own space
        (``[n_experts * d_expert, d_model]``; the latent space's width in a latent MoE)."""
        w = self.experts.down_proj  # [E, d, H] transposed, [E, H, d] otherwise
        return (w if self.experts.is_transposed else w.transpose(1, 2)).reshape(
            -1, w.shape[-1 if self.experts.is_transposed else 1]
        )

    def values(self) -> Tensor:
        """The layer's value vectors, ``[n_experts * d_expert + d_shared, d_model]``: a copy, in
        neuron order (routed experts', then the shared expert's)."""
        rows = self._to_model(self._own_rows())
        if self.shared is None:
            return rows
        return torch.cat([rows, self.shared.down_proj.weight.T.to(rows.dtype)])

    def shared_values(self) -> Tensor:
        """The shared expert's value vectors, ``[d_shared, d_model]`` (a copy of its down projection's columns)."""
        assert self.shared is not None, "this block has no shared expert"
        return self.shared.down_proj.weight.T.detach().clone()

    def expert_values(self, e: int) -> Tensor:
        """Expert ``e``'s value vectors, ``[d_expert, d_model]`` (a copy of its slice of the stacked weight)."""
        w = self.experts.down_proj[e]
        return self._to_model(w if self.experts.is_transposed else w.T).detach().clone()

    def column(self, i: int) -> Tensor:
        """Routed neuron ``i``'s column of its expert's stacked down projection (a view: writes reach it)."""
        e, j = divmod(i, self.d_expert)
        w = self.experts.down_proj
        return w[e, j] if self.experts.is_transposed else w[e, :, j]

    def neuron_rows(self) -> Tensor:
        """Every neuron's weights side by side, ``[d_mlp, 3 * d_model]``: its gate row, up row
        (input row where the experts are not gated: ``[d_mlp, 2 * d_model]``) and value vector (a copy);
        a latent MoE's routed neurons have theirs in the latent space (its own weights: the up row and
        the down-projection column), zero-padded to the shared expert's width."""
        ex, d = self.experts, self.d_expert
        name = "gate_up_proj" if ex.has_gate else "up_proj"
        w = getattr(ex, name)
        w = w.transpose(1, 2) if ex.is_transposed else w  # [E, out, H]
        if ex.has_gate:
            concat = getattr(ex, "is_concatenated", True)
            halves: tuple[Tensor, ...] = (w[:, :d], w[:, d:]) if concat else (w[:, 0::2], w[:, 1::2])
        else:
            halves = (w,)
        rows = torch.cat([h.reshape(-1, h.shape[-1]) for h in halves] + [self._own_rows()], dim=1)
        if self.shared is None:
            return rows
        sh = self.shared
        shared = [getattr(sh, attr).weight for _, attr in input_projections(sh)] + [sh.down_proj.weight.T]
        if len(shared) != len(halves) + 1:
            shared = [torch.zeros_like(shared[0])] * (len(halves) + 1 - len(shared)) + shared
        shared_rows = torch.cat(shared, dim=1).to(rows.dtype)
        width = max(rows.shape[1], shared_rows.shape[1])  # a latent MoE's routed rows are narrower
        pad = lambda r: torch.nn.functional.pad(r, (0, width - r.shape[1]))  # noqa: E731
        return torch.cat([pad(rows), pad(shared_rows)])

    # ---- the block's forward

    def choices(self, routing: Any, n_tok: int) -> tuple[Tensor, Tensor, Any]:
        """The router's output (``routing``, for ``n_tok`` tokens) as ``(weights, experts, extra)``:
        each token's chosen experts and their router weights, ``[n_tok, top_k]`` each, and what the
        block returns beside its output where it returns the router's scores."""
        if len(routing) == 2:  # (scores over all experts, 0 where not chosen; logits): Llama 4's router
            scores, extra = routing
            weights, index = scores.reshape(n_tok, -1).topk(self.top_k, dim=-1)
        elif len(routing) == 5:  # its choices grouped by expert: JetMoE's router
            (weights, index), extra = _grouped_routing(routing, n_tok, self.top_k), None
        else:  # (logits, the chosen experts' weights, their indices)
            _, weights, index = routing
            extra = weights
        return weights.reshape(n_tok, -1), index.reshape(n_tok, -1), extra

    def forward(self, hook: torch.nn.Module, hidden_states: Tensor, input_ids: Tensor | None = None) -> Any:
        shape = hidden_states.shape
        x = hidden_states.reshape(-1, shape[-1])
        # Gemma 4: the router and the experts read the residual the dense MLP's input was normalized from
        resid3 = hidden_states if self.branches is None else self.branches.tap.take(hidden_states)
        resid = resid3.reshape(x.shape)
        # the router's input: one row per token, or the block's own [batch, pos, d_model] (AFMoE's
        # router reads three axes), as found at load (_checked); its choices flattened to one row per token
        r_in = hidden_states if self.router_3d else resid
        extra_in: tuple = tuple(getattr(self.block, n) for n in self.router_args)
        if self.by_token and (input_ids is None or input_ids.numel() != x.shape[0]):
            raise ValueError(
                f"layer {self.layer} routes each token by its id (hash routing), and this forward gave "
                f"{'no token ids' if input_ids is None else f'{input_ids.numel()} ids for {x.shape[0]} tokens'}: "
                "run the model on token ids"
            )
        routing = self.router(r_in, *extra_in, **({_BY_TOKEN: input_ids} if self.by_token else {}))
        weights, index, extra = self.choices(routing, x.shape[0])
        n_tok, width = x.shape[0], self.n_experts * self.d_expert
        xe = x if self.latent is None else self.latent[0](x)  # the routed experts' input
        if self.branches is not None:  # the norms run on [batch, pos, d_model], as their hooks show it
            xe = self.branches.pre2(resid3).reshape(x.shape)
        acts = x.new_zeros(n_tok, self.n_experts, self.d_expert)
        routed = []
        for e in index.unique().tolist():
            hit = index == e  # a token may pick one expert in two slots (a hash table's row): the weights add
            tok = hit.any(1).nonzero().squeeze(1)
            w = (weights * hit).sum(1)[tok, None]
            a = self.activation(e, xe[tok] * w) if self.input_weighted else self.activation(e, xe[tok]) * w
            acts[tok, e] = a.to(x.dtype)
            routed.append((e, tok, w))
        parts = [acts.reshape(n_tok, width)]
        if self.shared is not None:
            s = mlp_neurons(self.shared, x)
            if self.shared_gate is not None:
                s = torch.sigmoid(self.shared_gate(x)) * s
            parts.append(s.to(x.dtype))
        neurons = hook(torch.cat(parts, dim=-1).reshape(*shape[:-1], -1)).reshape(n_tok, -1)
        acts = neurons[:, :width].reshape(n_tok, self.n_experts, self.d_expert)
        out = xe.new_zeros(xe.shape)
        for e, tok, w in routed:
            y = self.down(e, acts[tok, e])
            b = self.down_bias(e)
            if b is not None:
                y = y + (b if self.input_weighted else w * b)
            out = out.index_add(0, tok, y.to(x.dtype))
        if self.latent is not None:
            out = self.latent[1](out)
        if self.branches is not None:  # each branch normalized, then the two added
            assert self.shared is not None
            dense = self.shared.down_proj(neurons[:, width:]).reshape(shape)
            out = self.branches.post_experts(out.reshape(shape)) + self.branches.post_dense(dense)
        elif self.shared is not None:
            out = out + self.shared.down_proj(neurons[:, width:])
        if self.out_bias is not None:  # added to the layer's output, owned by no neuron (JetMoE)
            out = out + self.out_bias
        out = out.reshape(shape)
        return (out, extra) if self.returns_scores else out


def _zero_out(x: Tensor, *args: Any, **kwargs: Any) -> Tensor:
    """The forward of a shared expert whose neurons the MoE block's forward computes (Granite 4.0)."""
    return torch.zeros_like(x)


def _width(spec: ExpertBlock | DenseBlock) -> int:
    return spec.width if isinstance(spec, DenseBlock) else spec.n_experts * spec.d_expert + spec.d_shared


def latent_layers(model: Model) -> list[int]:
    """The layers whose routed experts work in a latent space (NemotronH's ``moe_latent_size``)."""
    return [b.layer for b in getattr(model, "capinterp_experts", None) or [] if getattr(b, "latent", None) is not None]


def branched(model: Model, layer: int) -> bool:
    """Whether ``layer`` runs experts beside a dense MLP, each branch normalized before the two add
    (Gemma 4's MoE layers, :mod:`capinterp.arch.branch_experts`): the layer's output is then no sum of
    value vectors, each branch's is."""
    blocks = getattr(model, "capinterp_experts", None) or ()
    return layer < len(blocks) and getattr(blocks[layer], "branches", None) is not None


def is_moe(model: Model) -> bool:
    """Whether the model's FFNs are mixtures of experts (their neurons are ``(layer, expert, neuron)``)."""
    return family_of(model).moe is not None


def expert_block(model: Model, layer: int) -> ExpertBlock | DenseBlock:
    """Layer ``layer``'s :class:`ExpertBlock` of a model :func:`install` served (its :class:`DenseBlock`
    where the layer is a dense layer of a mixed model)."""
    blocks = getattr(model, "capinterp_experts", None)
    if not blocks:
        fam = family_of(model)
        raise ValueError(f"{fam.name} is not a mixture-of-experts model loaded by capinterp (no expert layers)")
    return blocks[layer]


def _has_experts(module: Any) -> bool:
    block = unwrap(module)
    return isinstance(getattr(block, "experts", None), torch.nn.Module) or _parallel_experts(block)


class _GateHalves:
    """transformers' experts flags for gated experts without biases whose up projection's output is
    ``[gate | up]`` (gate half first), activated as ``act_fn(gate) * up``; subclasses supply
    ``act_fn``, the weights and ``is_transposed``."""

    has_gate, has_bias, is_concatenated, has_post_expert_norm = True, False, True, False
    act_fn: Any

    def _apply_gate(self, h: Tensor) -> Tensor:
        gate, up = h.chunk(2, dim=-1)
        return self.act_fn(gate) * up


class _Stacked(_GateHalves):
    """transformers' experts flags for a module that stores its experts as stacked 3-D weights without
    them (Llama 4: ``gate_up_proj [E, d_model, 2 d_expert]``, ``down_proj [E, d_expert, d_model]``,
    ``act(gate) * up`` on the two halves): the orientation is read from the shapes, the rest is what
    the module computes; :func:`_checked` then compares the whole block with transformers' own forward."""

    def __init__(self, module: Any, d_model: int) -> None:
        self.module = module
        self.is_transposed = int(module.down_proj.shape[-1]) == d_model

    def __getattr__(self, name: str) -> Any:  # parameters and act_fn: the module's own
        if name == "module":  # not set yet (a copy under construction): no recursion through __getattr__
            raise AttributeError(name)
        return getattr(self.module, name)


class _Parallel(_GateHalves):
    """transformers' experts flags for a block that keeps its experts as two ``ParallelExperts``
    modules (JetMoE: ``input_linear.weight [E, 2 d_expert, d_model]``, gate half first,
    ``output_linear.weight [E, d_model, d_expert]``, ``activation(gate) * up``): views of the block's
    own parameters, so reads and in-place writes reach the model; :func:`_checked` then compares
    the whole block with transformers' own forward."""

    is_transposed = False

    def __init__(self, block: Any) -> None:
        self.gate_up_proj = unwrap(block.input_linear).weight
        self.down_proj = unwrap(block.output_linear).weight
        self.act_fn = block.activation

    def parameters(self) -> Any:
        return iter((self.gate_up_proj, self.down_proj))


def _parallel_experts(block: Any) -> bool:
    """Whether ``block`` is an FFN of experts kept as ``input_linear`` / ``output_linear``
    ``ParallelExperts`` (3-D weights) with a router and an activation (JetMoE's MoE block; its
    attention's mixture of query experts has no activation and is not an FFN)."""
    weights = [getattr(unwrap(getattr(block, k, None)), "weight", None) for k in ("input_linear", "output_linear")]
    return (
        all(isinstance(w, torch.Tensor) and w.dim() == 3 for w in weights)
        and callable(getattr(block, "activation", None))
        and getattr(block, "router", None) is not None
    )


def _grouped_routing(routing: tuple, n_tok: int, top_k: int) -> tuple[Tensor, Tensor]:
    """Per-token ``(weights, experts)``, ``[n_tok, top_k]`` each, from a router that returns its choices
    grouped by expert (JetMoE's ``(order, token of each row, weight of each row, rows per expert,
    logits)``: row ``r`` of the grouped order is slot ``order[r]`` of the flattened ``[n_tok, top_k]``
    choices, and the rows run through the experts in order, ``rows per expert[e]`` each)."""
    order, _, gates, sizes, _ = routing
    experts = torch.repeat_interleave(
        torch.arange(len(sizes), device=gates.device), torch.as_tensor(sizes).to(gates.device)
    )
    weights = gates.new_zeros(n_tok * top_k).index_copy(0, order, gates)
    index = torch.zeros(n_tok * top_k, dtype=torch.long, device=gates.device).index_copy(0, order, experts)
    return weights.reshape(n_tok, top_k), index.reshape(n_tok, top_k)


def _flagged(experts: Any, d_model: int) -> Any:
    """``experts`` where it carries transformers' flags, a :class:`_Stacked` view where it stores
    gated stacked weights without them, None where its neurons cannot be read."""
    down, gate_up = getattr(experts, "down_proj", None), getattr(experts, "gate_up_proj", None)
    if not (isinstance(down, torch.Tensor) and down.dim() == 3):
        return None
    if hasattr(experts, "is_transposed"):
        return experts
    if isinstance(gate_up, torch.Tensor) and gate_up.dim() == 3 and callable(getattr(experts, "act_fn", None)):
        return _Stacked(experts, d_model)
    return None


_LATENT = ("fc1_latent_proj", "fc2_latent_proj")  # NemotronH's latent MoE (Nemotron 3 Super)


def _read_block(model: Model, layer: int, moe: MoE, label: str) -> ExpertBlock:
    """Layer ``layer``'s experts, checked against the transformers block (``label``: the family, for messages)."""
    mlp = getattr(model.blocks[layer], "mlp", None)
    block = unwrap(mlp)
    where = f"{label}, layer {layer}"
    parallel = _parallel_experts(block)
    experts = _Parallel(block) if parallel else unwrap(getattr(block, "experts", None))
    router = getattr(block, "router", None) or getattr(block, "gate", None)
    if mlp is None:
        raise UnsupportedFamily(
            f"{where}: the bridge's block has no MLP module (a layer without an FFN); capinterp needs an FFN, "
            "experts or dense, in every layer of a mixture-of-experts model"
        )
    if experts is None and branch_layer(model, layer):
        return _branch_block(model, layer, moe, where, block)
    if experts is None and getattr(unwrap(model.blocks[layer]), "experts", None) is not None:
        raise UnsupportedFamily(
            f"{where}: the decoder layer runs experts beside its dense MLP ({type(block).__name__}) without "
            "Gemma 4's enable_moe_block and branch norms (pre_feedforward_layernorm_2, post_feedforward_layernorm_1 "
            "/ _2), the one such layout capinterp serves; expert neurons are not defined"
        )
    if experts is None or router is None:
        raise UnsupportedFamily(
            f"{where}: the FFN ({type(block).__name__}) is not a sparse mixture-of-experts block with an 'experts' "
            "module (or input_linear / output_linear parallel experts) and a router; capinterp reads experts only "
            "from stacked 3-D expert weights"
        )
    latent = _latent(where, block)
    flagged = _flagged(experts, int(model.cfg.d_model))
    if flagged is None:
        raise UnsupportedFamily(
            f"{where}: {type(experts).__name__} does not store its experts as transformers' stacked 3-D weights "
            "(down_proj [n_experts, ...], with is_transposed or a gated gate_up_proj); its expert neurons cannot be read"
        )
    experts, down = flagged, flagged.down_proj
    n_experts, d_expert = _expert_shape(where, experts)
    shared = unwrap(
        getattr(block, "shared_expert", None)
        or getattr(block, "shared_experts", None)
        or getattr(block, "shared_mlp", None)
    )
    beside = None
    if shared is None and mlp is not None:  # Granite 4.0: the decoder layer adds its shared MLP beside the block
        beside = unwrap(getattr(unwrap(model.blocks[layer]), "shared_mlp", None))
        if beside is not None and not fused_gated(beside):
            raise UnsupportedFamily(
                f"{where}: the shared MLP beside the experts ({type(beside).__name__}) is not a gated MLP with one "
                "fused input_linear [gate | up] and output_linear, without biases"
            )
        shared = FusedNames(beside) if beside is not None else None
    if shared is not None and not is_mlp(shared):
        raise UnsupportedFamily(
            f"{where}: the shared expert {type(shared).__name__} is not an MLP (up_proj, down_proj, an activation; "
            "gate_proj where gated)"
        )
    d_shared = int(shared.down_proj.in_features) if shared is not None else 0
    # a shared expert the config does not name (Llama 4's is always there): the modules are the truth,
    # and install returns its width in the neuron axis the family is built with
    if (n_experts, d_expert, d_shared) != (moe.n_experts, moe.d_expert, moe.d_shared if moe.n_shared else d_shared):
        raise UnsupportedFamily(
            f"{where}: the experts hold {n_experts} x {d_expert} neurons (+{d_shared} shared), the config says "
            f"{moe.n_experts} x {moe.d_expert} (+{moe.d_shared})"
        )
    spec = ExpertBlock(
        layer=layer,
        block=block,
        router=router,
        experts=experts,
        shared=shared,
        shared_gate=getattr(block, "shared_expert_gate", None) if shared is not None else None,
        n_experts=n_experts,
        d_expert=d_expert,
        d_shared=d_shared,
        returns_scores=False,
        router_args=_router_args(where, block, router),
        by_token=_BY_TOKEN in _params(unwrap(router).forward),
        top_k=moe.top_k,
        out_bias=getattr(block, "bias", None) if parallel else None,
        shared_beside=beside,
        latent=latent,
    )
    return _checked(where, spec, down)


def _expert_shape(where: str, experts: Any) -> tuple[int, int]:
    """``(n_experts, d_expert)`` of stacked experts (read with transformers' flags, :func:`_flagged`);
    refused where a norm follows each expert's down projection or the weights are offloaded."""
    if getattr(experts, "has_post_expert_norm", False):
        raise UnsupportedFamily(
            f"{where}: a norm follows each expert's down projection, so the layer's output is not a sum over "
            "neurons; expert neurons are not defined"
        )
    if any(p.device.type == "meta" for p in experts.parameters()):
        raise UnsupportedFamily(
            f"{where}: the experts' weights are offloaded (meta device); capinterp's expert forward reads them "
            "directly, so place the model on devices without CPU / disk offload"
        )
    down = experts.down_proj
    return int(down.shape[0]), int(down.shape[1] if experts.is_transposed else down.shape[2])


def _branch_block(model: Model, layer: int, moe: MoE, where: str, dense: Any) -> ExpertBlock:
    """Gemma 4's MoE layer (:mod:`capinterp.arch.branch_experts`): the decoder layer's routed experts
    and router, its dense MLP the shared expert, each branch normalized before the two add."""
    raw = unwrap(model.blocks[layer])
    experts = _flagged(unwrap(raw.experts), int(model.cfg.d_model))
    if experts is None or not is_mlp(dense):
        raise UnsupportedFamily(
            f"{where}: the experts beside the dense MLP ({type(unwrap(raw.experts)).__name__}, "
            f"{type(dense).__name__}) are not stacked 3-D gated experts beside a gated MLP"
        )
    n_experts, d_expert = _expert_shape(where, experts)
    if (n_experts, d_expert) != (moe.n_experts, moe.d_expert):
        raise UnsupportedFamily(
            f"{where}: the experts hold {n_experts} x {d_expert} neurons, the config says "
            f"{moe.n_experts} x {moe.d_expert}"
        )
    router = model.blocks[layer].router
    return ExpertBlock(
        layer=layer,
        block=dense,
        router=router,
        experts=experts,
        shared=dense,
        shared_gate=None,
        n_experts=n_experts,
        d_expert=d_expert,
        d_shared=int(unwrap(dense.down_proj).in_features),
        returns_scores=False,
        router_args=_router_args(where, dense, router),
        top_k=moe.top_k,
        branches=normed_branches(model, layer, where),
    )


def _latent(where: str, block: Any) -> tuple[Any, Any] | None:
    """NemotronH's latent projections around the routed experts (``fc1_latent_proj``, ``fc2_latent_proj``),
    None where they are identities (no latent space); refused where they are not Linears."""
    mods = [unwrap(getattr(block, k, None)) for k in _LATENT]
    if all(m is None or isinstance(m, torch.nn.Identity) for m in mods):
        return None
    if not all(isinstance(m, torch.nn.Linear) for m in mods):
        raise UnsupportedFamily(
            f"{where}: the experts' latent projections ({', '.join(type(m).__name__ for m in mods)}) are not Linears; "
            "capinterp reads a latent expert's value vectors through fc2_latent_proj's weight"
        )
    return mods[0], mods[1]


_BY_TOKEN = "input_ids"  # a block forward's and router's parameter for the token ids (DeepSeek-V4's hash routing)


def _params(fn: Any) -> list[str]:
    """The names of a forward's parameters after its first (the hidden states), ``*args`` / ``**kwargs`` left out."""
    ps = list(inspect.signature(fn).parameters.values())[1:]
    return [p.name for p in ps if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def _router_args(where: str, block: Any, router: Any) -> tuple[str, ...]:
    """Names of the block attributes the router takes after the hidden states (MiniMax-M2's, AFMoE's
    and LFM2-MoE's expert score bias), read from the router's signature; refused where the block's own
    forward takes more than its input and the token ids (DeepSeek-V4's hash routing, which
    :class:`ExpertBlock` passes on), or the router takes something the block does not hold."""
    extra = [p.name for p in list(inspect.signature(block.forward).parameters.values())[1:] if p.name != _BY_TOKEN]
    if extra:
        raise UnsupportedFamily(
            f"{where}: the MoE block ({type(block).__name__}) takes {extra} besides the layer's input and token ids "
            "(routing by other state); capinterp's expert forward, which routes by the input alone, cannot stand in"
        )
    if _BY_TOKEN in _params(unwrap(router).forward) and _BY_TOKEN not in _params(block.forward):
        raise UnsupportedFamily(
            f"{where}: the router takes the token ids, which the MoE block ({type(block).__name__}) is not given; "
            "capinterp's expert forward cannot route these tokens"
        )
    params = [p for p in list(inspect.signature(unwrap(router).forward).parameters.values())[1:] if p.name != _BY_TOKEN]
    names = tuple(
        p.name
        for p in params
        if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        # an optional one only where the block holds it (LFM2-MoE's expert_bias, a buffer its block passes)
        and (p.default is inspect.Parameter.empty or hasattr(block, p.name))
    )
    missing = [n for n in names if not hasattr(block, n)]
    if missing:
        raise UnsupportedFamily(
            f"{where}: the router takes {missing}, which the block does not hold (routing by something other than "
            "the layer's input); capinterp's expert forward cannot route these tokens"
        )
    return names


def _clamps(spec: ExpertBlock) -> bool:
    """Whether the experts or the shared expert clamp their neurons' inputs (gpt-oss's and DeepSeek-V4's ``limit``)."""
    return any(isinstance(getattr(m, "limit", None), (int, float)) for m in (spec.experts, spec.shared))


def _vocab(router: Any) -> int:
    """The token ids a router routes by (its token -> experts table's rows; 1 where it takes no ids)."""
    table = getattr(unwrap(router), "tid2eid", None)
    return int(table.shape[0]) if isinstance(table, Tensor) else 1


@torch.no_grad()
def _checked(where: str, spec: ExpertBlock, like: Tensor) -> ExpertBlock:
    """``spec`` with the block's return convention (a tensor, or (output, router scores)), after
    checking that its forward computes what the transformers block computes on random inputs:
    a block whose routing or experts need a step :class:`ExpertBlock` does not take (router weights
    applied to the input, a soft-cap, a post-expert norm...) is refused here, never a wrong number."""
    gen = torch.Generator().manual_seed(0)
    width = int(like.shape[-1] if spec.experts.is_transposed else like.shape[1])
    if spec.latent is not None:  # the block reads the residual stream, its experts the latent space
        width = int(spec.latent[0].in_features)
    x = torch.randn(2, 6, width, generator=gen)
    x = x.to(device=like.device, dtype=like.dtype)
    ids = torch.randint(0, _vocab(spec.router), x.shape[:-1], generator=gen).to(like.device)
    by_token = {_BY_TOKEN: ids} if spec.by_token else {}
    spec = _matched(where, spec, x, by_token)
    if _clamps(spec):  # and on inputs large enough that the clamps bite, so a path without them fails here
        _matched(where, spec, x * 100.0, by_token, fixed=True)
    return spec


def _matched(where: str, spec: ExpertBlock, x: Tensor, by_token: dict, fixed: bool = False) -> ExpertBlock:
    """The first reading of the block's routing (``router_3d``, ``input_weighted``) whose forward on ``x``
    reproduces the transformers block's (only ``spec``'s own where ``fixed``); refused where none does."""
    try:
        want = spec.block(x, **by_token)
        if spec.shared_beside is not None:  # the layer's FFN: the block, plus the shared MLP beside it
            want = want + spec.shared_beside(x)
    except Exception as err:  # any failure of the block on its own is a refusal
        raise UnsupportedFamily(
            f"{where}: the MoE block ({type(spec.block).__name__}) cannot run on the layer's input alone "
            f"({type(err).__name__}: {err}); capinterp's expert forward cannot stand in for it"
        ) from err
    spec = replace(spec, returns_scores=isinstance(want, tuple))
    want_t = want[0] if isinstance(want, tuple) else want
    tol = max(1e-4, 16 * torch.finfo(x.dtype).eps) * max(1.0, float(want_t.abs().max()))
    from transformer_lens.hook_points import HookPoint

    found = []
    # the router's input as the block gives it (rows, or [batch, pos, d_model]), and where its weight
    # goes (the expert's output, or its input as in Llama 4): the first reading that reproduces the block
    readings = ((False, False), (True, False), (False, True), (True, True))
    for router_3d, input_weighted in [(spec.router_3d, spec.input_weighted)] if fixed else readings:
        candidate = replace(spec, router_3d=router_3d, input_weighted=input_weighted)
        try:
            got = candidate.forward(HookPoint(), x, **by_token)
        except Exception as err:  # a router that reads the other layout
            found.append(f"{type(err).__name__}: {err}")
            continue
        got_t = got[0] if isinstance(got, tuple) else got
        if got_t.numel() != want_t.numel():
            found.append(f"returns {tuple(got_t.shape)}, the block {tuple(want_t.shape)}")
            continue
        # the block may return one row per token (Llama 4: its layer views it back to [batch, pos, d_model])
        err_max = float((got_t.float().reshape(want_t.shape) - want_t.float()).abs().max())
        if err_max <= tol:
            return candidate
        found.append(f"differs by {err_max:.3g}")
    raise UnsupportedFamily(
        f"{where}: the layer's output is not the router-weighted sum of its experts' neurons that capinterp "
        f"computes ({type(spec.block).__name__}: {'; '.join(found)}; its routing or experts take a step capinterp "
        "does not know); expert neurons are not defined"
    )


def install(model: Model, fam: Family) -> NeuronAxis:
    """Serve every MoE layer of ``model`` through :class:`ExpertBlock`'s forward, its neurons at
    ``blocks.{l}.mlp.hook_post``; refused with :class:`UnsupportedFamily` where it cannot be done. A
    dense model whose layers differ in width (NemotronH's: its mixer layers' FFN has no neurons) is
    served the same way, every layer a :class:`DenseBlock` on the widest layer's axis; any other
    model is left as it is. ``fam``: the record the configs give (:func:`~capinterp.arch.family.read_family`
    without an axis); returns the neuron axis the layers give, which the model's record is then built with."""
    if getattr(model, "capinterp_experts", None):  # served already: the axis its record holds
        done = family_of(model)
        return NeuronAxis(done.d_mlp, done.moe, done.layer_widths)
    label = f"{fam.name} ({fam.architecture})"
    moe = fam.moe
    if moe is None:  # a dense model whose layers differ in width, served on one axis
        widths = _dense_widths(model)
        ffn_only = bool(set(fam.hybrid_layers) & set(FFN_ONLY_LAYERS))  # NemotronH: mixer layers without neurons
        if not ffn_only and len(set(widths)) <= 1:
            return NeuronAxis(fam.d_mlp)
        # Gemma 4's double-wide MLPs in its KV-sharing layers: the widest is the axis
        d_mlp = fam.d_mlp if ffn_only else max(widths)
        return _serve(
            model, d_mlp, None, [dense_block(model, layer, d_mlp, label=label) for layer in range(len(model.blocks))]
        )
    has = [_has_experts(getattr(b, "mlp", None)) for b in model.blocks]
    experts = {
        layer: _read_block(model, layer, moe, label) for layer in range(len(model.blocks)) if has[layer] or not any(has)
    }
    shared = {b.d_shared for b in experts.values()}
    if len(shared) > 1:
        raise UnsupportedFamily(
            f"{label}: the expert layers' shared experts differ in width ({sorted(shared)}), "
            "which the config does not say; capinterp needs one neuron axis for every expert layer"
        )
    if shared != {moe.d_shared}:  # a shared expert the config does not name (Llama 4)
        moe = replace(moe, n_shared=1, d_shared=shared.pop())
    blocks: list[Any] = [
        experts.get(layer) or dense_block(model, layer, moe.width, moe, label=label)
        for layer in range(len(model.blocks))
    ]
    split = [b.layer for b in blocks if getattr(b, "branches", None) is not None]
    probed = probe_branches(model, split) if split else {}  # transformers' own, before capinterp serves them
    axis = _serve(model, moe.width, moe, blocks)
    if probed:
        check_branches(model, probed, label)
    return axis


def _dense_widths(model: Model) -> list[int]:
    """Each layer's MLP width read from its down projection, for the layers whose FFN is an MLP
    (the others are read by the config's width as before)."""
    widths = []
    for b in model.blocks:
        mlp = named_gated(unwrap(getattr(b, "mlp", None)))
        if mlp is not None and is_mlp(mlp):
            widths.append(int(unwrap(mlp.down_proj).in_features))
    return widths


def _serve(model: Model, d_mlp: int, moe: MoE | None, blocks: list[Any]) -> NeuronAxis:
    """Every layer through its spec's forward, its neurons at ``blocks.{l}.mlp.hook_post``; returns the
    ``d_mlp``-wide axis, with each layer's width where some are narrower (padded)."""
    from transformer_lens.hook_points import HookPoint

    widths = tuple(_width(b) for b in blocks)
    axis = NeuronAxis(d_mlp, moe, widths if any(w < d_mlp for w in widths) else ())
    for spec in blocks:
        mlp = model.blocks[spec.layer].mlp
        hook = HookPoint()
        mlp.add_module(_HOOK, hook)
        aliases = dict(getattr(mlp, "hook_aliases", {}) or {})
        mlp.hook_aliases = {**aliases, "hook_post": _HOOK}
        if "hook_post" in mlp.__dict__:
            object.__setattr__(mlp, "hook_post", hook)
        module_of(spec.block).forward = functools.partial(spec.forward, hook)
        if isinstance(spec, ExpertBlock) and spec.branches is not None:
            serve_branches(model, spec.layer, spec.branches)
        if isinstance(spec, ExpertBlock) and spec.shared_beside is not None:  # its neurons are in the block's now
            spec.shared_beside.forward = _zero_out
    model.capinterp_experts = blocks
    model.clear_hook_registry()
    model._scan_existing_hooks(model, "")
    return axis
