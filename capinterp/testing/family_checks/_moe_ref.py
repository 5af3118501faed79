"""The reference side for mixture-of-experts families: a plain transformers MoE model made dense.

:func:`densify` gives each sparse MoE block of a plain transformers model a reference forward that
computes *every* expert on *every* token from transformers' own expert weights and gate function
(``experts._apply_gate`` / ``act_fn``), weights them by the router's top-k weights scattered to a
dense ``[tokens, n_experts]`` matrix (0 for experts not chosen), and hands the resulting neurons
``[batch, pos, n_experts * d_expert (+ shared)]`` to one module named ``down_proj``
(:class:`ExpertsDown`: neurons @ stacked value vectors, plus the router-weighted expert biases).
So the dense references of the other checks (pre-hooks on the down projection's input, its
weight as ``[d_mlp, d_model]`` value rows) apply unchanged. The dense layers of a model mixing
dense and MoE layers keep their plain transformers MLP (their neurons are the first ones of
capinterp's axis; :func:`moe_layers` tells the MoE layers by decoder layer index). Written here independently of
:mod:`capinterp.arch.experts` (dense over all experts, where capinterp loops over routed ones);
:func:`densify` checks that the model's logits do not change.
"""

from __future__ import annotations

import inspect
import types
from typing import Any

import torch

from capinterp.testing.contract import require

__all__ = [
    "ExpertsDown",
    "densify",
    "is_branched",
    "is_moe",
    "moe_layers",
    "moe_neuron_entries",
    "moe_neuron_rows",
    "split_values",
]


# where a block keeps its shared expert (HunYuan-MoE's shared_mlp is not named in its config)
_SHARED = ("shared_expert", "shared_experts", "shared_mlp")


def _jetmoe(m: Any) -> bool:
    """JetMoE's MoE FFN block (transformers' ``JetMoeMoE``; its attention's ``JetMoeMoA`` is no FFN)."""
    return type(m).__name__ == "JetMoeMoE"


def _sparse(m: Any) -> bool:
    experts = getattr(m, "experts", None)
    stacked = isinstance(experts, torch.nn.Module) and isinstance(getattr(experts, "down_proj", None), torch.Tensor)
    return stacked or _jetmoe(m)


def is_branched(layer: Any) -> bool:
    """Whether a plain transformers decoder layer runs experts beside its MLP, each branch normalized
    (Gemma 4's MoE layers), before or after :func:`._branch_ref.dense_branches` rewrote it."""
    if getattr(layer, "_ref_down", None) is not None:
        return True
    return bool(getattr(layer, "enable_moe_block", False)) and hasattr(layer, "post_feedforward_layernorm_2")


def is_moe(hf: Any) -> bool:
    """Whether a plain transformers model has sparse MoE FFN blocks (stacked experts, or JetMoE's)."""
    return any(_sparse(m) for m in hf.modules())


def _blocks(hf: Any) -> list[tuple[str, Any]]:
    return [(n, m) for n, m in hf.named_modules() if _sparse(m)]


def moe_layers(hf: Any) -> dict[int, tuple[str, Any]]:
    """``{decoder layer index: (name, sparse MoE block)}``; the layers missing are dense (a model mixing
    dense and MoE layers, DeepSeek's ``first_k_dense_replace``: their plain transformers MLP is kept)."""
    from capinterp.testing.family_checks._hf import decoder_layers

    names = {id(m): n for n, m in _blocks(hf)}
    out: dict[int, tuple[str, Any]] = {}
    for i, layer in enumerate(decoder_layers(hf)):
        found = [m for m in layer.modules() if id(m) in names]
        require(len(found) <= 1, lambda: f"decoder layer {i} holds {len(found)} MoE blocks")
        if found:
            out[i] = (names[id(found[0])], found[0])
    require(len(out) == len(names), "an MoE block outside the decoder layers")
    return out


class ExpertsDown(torch.nn.Module):
    """``neurons [..., W] -> [..., d_model]``: the stacked value vectors (routed experts' then the
    shared expert's), plus ``weights @ down_proj_bias`` where the experts have biases. ``weight`` is
    ``[W, d_model]`` (Conv1D-like ``[in, out]``), read live from the experts' parameters."""

    def __init__(self, block: Any, shared: Any) -> None:
        super().__init__()
        self._refs = types.SimpleNamespace(block=block, shared=shared)  # not submodules: no duplicate params

    # its weight's layout in Conv1D's names ([nx, nf]: inputs, outputs), so capinterp.arch.linear.is_conv1d
    # and linear_layout read it as it is stored
    @property
    def nx(self) -> int:
        return int(self.weight.shape[0])

    @property
    def nf(self) -> int:
        return int(self.weight.shape[1])

    @property
    def weight(self) -> torch.Tensor:
        ex = self._refs.block.experts
        w = ex.down_proj if ex.is_transposed else ex.down_proj.transpose(1, 2)  # [E, d, H]
        routed = w.reshape(-1, w.shape[-1])
        fc2 = _latent_out(self._refs.block)
        rows = [routed if fc2 is None else routed @ fc2.weight.T]  # a latent MoE's experts write through fc2
        if self._refs.shared is not None:
            rows.append(self._refs.shared.down_proj.weight.T)
        return torch.cat(rows)

    def forward(self, neurons: torch.Tensor, weights: torch.Tensor | None = None) -> torch.Tensor:
        ex = self._refs.block.experts
        if weights is not None:  # an expert takes part only on the tokens routed to it
            d = ex.down_proj.shape[1] if ex.is_transposed else ex.down_proj.shape[2]
            routed = (weights != 0).to(neurons.dtype).repeat_interleave(d, dim=-1)  # [tokens, E * d]
            rest = torch.ones(weights.shape[0], neurons.shape[-1] - routed.shape[-1], dtype=neurons.dtype)
            neurons = neurons * torch.cat([routed, rest], -1).reshape(neurons.shape)
        out = neurons @ self.weight.to(neurons.dtype)
        if weights is not None and getattr(ex, "has_bias", False):
            out = out + (weights @ ex.down_proj_bias).reshape(out.shape)
        fc2 = _latent_out(self._refs.block)
        if fc2 is not None and fc2.bias is not None:
            out = out + fc2.bias
        return out


def _latent_out(block: Any) -> Any:
    """NemotronH's ``fc2_latent_proj`` where the routed experts work in a latent space (None otherwise)."""
    fc2 = getattr(block, "fc2_latent_proj", None)
    return fc2 if isinstance(fc2, torch.nn.Linear) else None


def _latent_in(block: Any, x: torch.Tensor) -> torch.Tensor:
    """The routed experts' input: ``fc1_latent_proj(x)`` in a latent MoE, ``x`` otherwise."""
    fc1 = getattr(block, "fc1_latent_proj", None)
    return fc1(x) if isinstance(fc1, torch.nn.Linear) else x


def _halves_gate(experts: Any, h: torch.Tensor) -> torch.Tensor:
    """``act_fn(gate) * up`` on a ``[gate | up]`` projection (Llama 4's and JetMoE's experts)."""
    gate, up = h.chunk(2, dim=-1)
    return experts.act_fn(gate) * up


def flag_llama4(block: Any) -> bool:
    """Llama 4's MoE block (transformers' ``Llama4TextMoe``) written out by hand: its experts keep
    ``gate_up_proj [E, d_model, 2 d]`` (gate half first) and ``down_proj [E, d, d_model]`` without
    transformers' experts flags, its router returns ``(scores over all experts, logits)`` and its
    forward scales each expert's *input* by the router score; its shared expert names its activation
    ``activation_fn``. Sets the flags this module reads on the plain model's modules; True for such a block."""
    if type(block).__name__ != "Llama4TextMoe":
        return False
    ex = block.experts
    for k, v in dict(is_transposed=True, has_gate=True, has_bias=False, is_concatenated=True).items():
        object.__setattr__(ex, k, v)
    object.__setattr__(ex, "_apply_gate", types.MethodType(_halves_gate, ex))
    object.__setattr__(block.shared_expert, "act_fn", block.shared_expert.activation_fn)
    return True


def flag_jetmoe(block: Any) -> bool:
    """JetMoE's MoE block written out by hand: its experts are ``input_linear.weight [E, 2 d, d_model]``
    (gate half first) and ``output_linear.weight [E, d_model, d]``, ``activation(gate) * up``; its
    router takes the top-k of ``router.layer``'s logits and a softmax over those k; the block adds
    ``bias`` to its output. Gives the plain block an ``experts`` view with transformers' flags (not a
    submodule: no duplicate parameters); True for such a block."""
    if not _jetmoe(block):
        return False
    view = types.SimpleNamespace(
        gate_up_proj=block.input_linear.weight,
        down_proj=block.output_linear.weight,
        is_transposed=False,
        has_gate=True,
        has_bias=False,
        is_concatenated=True,
        act_fn=block.activation,
    )
    view._apply_gate = types.MethodType(_halves_gate, view)
    object.__setattr__(block, "experts", view)
    return True


def _jetmoe_routing(block: Any, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    logits = block.router.layer(x).float()
    top_v, top_i = logits.topk(block.router.top_k, dim=-1)
    return torch.softmax(top_v, dim=-1).to(x.dtype), top_i


class _FusedHalf:
    """Rows ``[half * d, (half + 1) * d)`` of a fused ``[gate | up]`` Linear without bias, read as a Linear."""

    def __init__(self, fused: torch.nn.Linear, half: int) -> None:
        self.fused, self.half = fused, half

    @property
    def weight(self) -> torch.Tensor:
        d = self.fused.weight.shape[0] // 2
        return self.fused.weight[self.half * d : (self.half + 1) * d]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight.T


def _beside(hf: Any, block: Any) -> Any:
    """Granite 4.0's shared MLP, which the decoder layer adds beside the MoE block (``shared_mlp``:
    ``activation(gate) * up`` of one fused ``input_linear``, then ``output_linear``), under the
    names this module reads (``gate_proj`` / ``up_proj`` / ``down_proj`` / ``act_fn``); its own
    forward then returns 0, the dense block computing it. None where the layer has none."""
    from capinterp.testing.family_checks._hf import decoder_layers

    layer = next(m for m in decoder_layers(hf) if any(b is block for b in m.modules()))
    mlp = getattr(layer, "shared_mlp", None)
    if mlp is None:
        return None
    view = types.SimpleNamespace(
        module=mlp,
        gate_proj=_FusedHalf(mlp.input_linear, 0),
        up_proj=_FusedHalf(mlp.input_linear, 1),
        down_proj=mlp.output_linear,
        act_fn=mlp.activation,
    )
    mlp.forward = lambda x: torch.zeros_like(x)
    return view


def _takes_ids(block: Any) -> bool:
    """DeepSeek-V4's MoE block: its forward takes the token ids (its hash layers route by them)."""
    return "input_ids" in inspect.signature(type(block).forward).parameters


def _limited(mlp: Any, gate: torch.Tensor, up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek-V4's shared expert clamps its gate at ``limit`` and its up projection at ``+-limit``."""
    limit = getattr(mlp, "limit", None)
    if limit is None:
        return gate, up
    return gate.clamp(max=limit), up.clamp(min=-limit, max=limit)


def _dense_forward(block: Any, hidden: torch.Tensor, input_ids: torch.Tensor | None = None) -> Any:
    ex, shared = block.experts, block._ref_shared
    router = getattr(block, "router", None) or block.gate
    B, T, H = hidden.shape
    x = hidden.reshape(-1, H)
    seen: dict[str, Any] = {}  # the routing transformers' own block forward decides (its router's output)
    if _jetmoe(block):  # its router returns its choices grouped by expert: the top-k written out here
        seen["out"] = (None, *_jetmoe_routing(block, x))
    else:
        handle = router.register_forward_hook(lambda _m, _i, out: seen.setdefault("out", out))
        try:
            ids = {"input_ids": input_ids} if _takes_ids(block) else {}
            type(block).forward(block, hidden, **ids)  # transformers' own forward (its output is not used)
        finally:
            handle.remove()
    if block._ref_input_weighted:  # Llama 4: (scores over all experts, 0 where not chosen; logits)
        dense_w = seen["out"][0].reshape(x.shape[0], -1)
        top_w = dense_w
    else:
        _, top_w, top_i = seen["out"]
        top_w, top_i = top_w.reshape(x.shape[0], -1), top_i.reshape(x.shape[0], -1)
        dense_w = torch.zeros(x.shape[0], ex.down_proj.shape[0], dtype=top_w.dtype).scatter_add(1, top_i, top_w)
    acts = []
    x_in = _latent_in(block, x)
    for e in range(ex.down_proj.shape[0]):
        name = "gate_up_proj" if ex.has_gate else "up_proj"
        w = getattr(ex, name)[e]
        xe = x_in * dense_w[:, e : e + 1] if block._ref_input_weighted else x_in
        h = xe @ w if ex.is_transposed else xe @ w.T
        if ex.has_bias:
            h = h + getattr(ex, f"{name}_bias")[e]
        a = ex._apply_gate(h) if ex.has_gate else ex.act_fn(h)
        routed = (dense_w[:, e : e + 1] != 0).to(a.dtype)
        acts.append(a * routed if block._ref_input_weighted else a * dense_w[:, e : e + 1])
    neurons = [torch.stack(acts, 1).reshape(x.shape[0], -1)]
    if shared is not None:
        gated = getattr(shared, "gate_proj", None) is not None  # NemotronH's shared expert: act(up(x)), no gate
        if gated:
            g, u = _limited(shared, shared.gate_proj(x), shared.up_proj(x))
            s = shared.act_fn(g) * u
        else:
            s = shared.act_fn(shared.up_proj(x))
        gate = getattr(block, "shared_expert_gate", None)
        neurons.append(torch.sigmoid(gate(x)) * s if gate is not None else s)
    out = block.down_proj(torch.cat(neurons, -1).reshape(B, T, -1).to(hidden.dtype), dense_w.to(hidden.dtype))
    if _jetmoe(block):
        out = out + block.bias
    return (out, top_w) if block._ref_returns_scores else out


@torch.no_grad()
def densify(hf: Any, ids: torch.Tensor | None = None) -> Any:
    """Give every sparse MoE block of ``hf`` the dense reference forward (in place; returns ``hf``);
    Gemma 4's layers of experts beside the MLP are left to :func:`._branch_ref.dense_branches`.

    The shared expert stays where it is (name searches skip paths through ``shared_expert`` and
    ``shared_mlp``, so ``down_proj`` is the only down projection they find); ``ids`` (default: a few tokens) check
    that the logits stay what transformers computes, to 1e-5.
    """
    if getattr(hf, "_ref_dense", False):
        return hf
    ids = torch.tensor([[1, 5, 9, 30, 7, 2]]) if ids is None else ids
    before = hf(ids).logits
    for _, block in _blocks(hf):
        if is_branched(block):  # Gemma 4's experts beside the MLP: ._branch_ref.dense_branches rewrites those
            continue
        flag_jetmoe(block)
        object.__setattr__(block, "_ref_input_weighted", flag_llama4(block))
        ids_in = {"input_ids": torch.zeros(1, 1, dtype=torch.long)} if _takes_ids(block) else {}
        fc2 = _latent_out(block)  # a latent MoE reads the residual stream, its experts the latent space
        width = (
            fc2.out_features
            if fc2 is not None
            else block.experts.down_proj.shape[-1 if block.experts.is_transposed else 1]
        )
        probe = block(torch.zeros(1, 1, width), **ids_in)
        shared = next((getattr(block, k) for k in _SHARED if getattr(block, k, None) is not None), None)
        if shared is None:
            shared = _beside(hf, block)
        object.__setattr__(block, "_ref_shared", shared)
        object.__setattr__(block, "_ref_returns_scores", isinstance(probe, tuple))
        block.add_module("down_proj", ExpertsDown(block, shared))
        block.forward = types.MethodType(_dense_forward, block)
    after = hf(ids).logits
    err = (after - before).abs().max().item()
    require(
        err <= 1e-5 * max(1.0, before.abs().max().item()),
        lambda: f"the dense MoE reference changed the logits by {err:.3g}",
    )
    hf._ref_dense = True
    return hf


def moe_neuron_entries(hf: Any, neurons: dict[int, list[int]]) -> dict[str, torch.Tensor]:
    """``{parameter name: bool mask}`` of the entries the given flat neurons own in a (densified)
    MoE model, by hand: expert ``e = i // d``'s gate and up rows ``j = i % d`` (halves ``j``, ``d + j``
    of ``gate_up_proj``, or ``2j``, ``2j + 1`` where interleaved) with their bias entries, and
    its value vector ``j`` in ``down_proj``; the shared expert's rows past the routed neurons.
    Only the MoE layers' neurons: ``neurons`` of dense layers are left to the caller."""
    names = {id(p): n.replace("._original_component", "") for n, p in hf.named_parameters()}
    masks: dict[str, torch.Tensor] = {}
    for layer, (_, block) in moe_layers(hf).items():
        ex = block.experts
        n_exp = ex.down_proj.shape[0]
        d = ex.down_proj.shape[1] if ex.is_transposed else ex.down_proj.shape[2]
        for i in neurons.get(layer, []):

            def mark(p: torch.Tensor, index: tuple) -> None:
                masks.setdefault(names[id(p)], torch.zeros_like(p, dtype=torch.bool))[index] = True

            if i < n_exp * d:
                e, j = divmod(i, d)
                name = "gate_up_proj" if ex.has_gate else "up_proj"
                rows = (
                    ([j, d + j] if getattr(ex, "is_concatenated", True) else [2 * j, 2 * j + 1]) if ex.has_gate else [j]
                )
                mark(getattr(ex, name), (e, slice(None), rows) if ex.is_transposed else (e, rows))
                if ex.has_bias:
                    mark(getattr(ex, f"{name}_bias"), (e, rows))
                mark(ex.down_proj, (e, j) if ex.is_transposed else (e, slice(None), j))
            else:
                j, sh = i - n_exp * d, block._ref_shared
                if isinstance(
                    getattr(sh, "gate_proj", None), _FusedHalf
                ):  # gate row j, up row d_shared + j: one weight
                    mark(sh.gate_proj.fused.weight, ([j, sh.down_proj.weight.shape[1] + j],))
                else:
                    if getattr(sh, "gate_proj", None) is not None:
                        mark(sh.gate_proj.weight, (j,))
                    mark(sh.up_proj.weight, (j,))
                mark(sh.down_proj.weight, (slice(None), j))
    return masks


def moe_neuron_rows(hf: Any) -> dict[int, torch.Tensor]:
    """Per MoE layer (decoder layer index), ``[W, k]``: each flat neuron's gate row, up row and value
    vector side by side, read by hand neuron by neuron (slow and obvious) from the experts' and shared
    expert's weights."""
    out = {}
    for layer, (_, block) in moe_layers(hf).items():
        ex, sh = block.experts, block._ref_shared
        n_exp = ex.down_proj.shape[0]
        d = ex.down_proj.shape[1] if ex.is_transposed else ex.down_proj.shape[2]
        name = "gate_up_proj" if ex.has_gate else "up_proj"
        w = getattr(ex, name)
        rows = []
        for e in range(n_exp):
            for j in range(d):
                picks = (
                    ([j, d + j] if getattr(ex, "is_concatenated", True) else [2 * j, 2 * j + 1]) if ex.has_gate else [j]
                )
                ins = [w[e, :, r] if ex.is_transposed else w[e, r] for r in picks]
                value = ex.down_proj[e, j] if ex.is_transposed else ex.down_proj[e, :, j]
                rows.append(torch.cat([*ins, value]))
        if sh is not None:
            gated = getattr(sh, "gate_proj", None) is not None
            for j in range(sh.down_proj.weight.shape[1]):
                ins = [sh.gate_proj.weight[j], sh.up_proj.weight[j]] if gated else [sh.up_proj.weight[j]]
                if len(ins) < len(picks):  # a plain shared expert beside gated experts: a zero gate row
                    ins = [torch.zeros_like(ins[0])] + ins
                rows.append(torch.cat([*ins, sh.down_proj.weight[:, j]]))
        width = max(r.numel() for r in rows)  # a latent MoE's routed rows (latent space) are narrower: zero-padded
        out[layer] = torch.stack([torch.nn.functional.pad(r, (0, width - r.numel())) for r in rows]).detach()
    return out


def split_values(hf: Any, layer: int, values: torch.Tensor) -> dict[str, torch.Tensor]:
    """``{parameter name: new tensor}`` holding the stacked value vectors ``values`` (``[W, d_model]``,
    :class:`ExpertsDown` order) in layer ``layer``'s experts' ``down_proj`` and shared expert."""
    name, block = moe_layers(hf)[layer]
    ex, sh = block.experts, block._ref_shared
    n_exp, w = ex.down_proj.shape[0], ex.down_proj
    d = w.shape[1] if ex.is_transposed else w.shape[2]
    routed = values[: n_exp * d].reshape(n_exp, d, -1)
    key = f"{name}.output_linear.weight" if _jetmoe(block) else f"{name}.experts.down_proj"
    out = {key: (routed if ex.is_transposed else routed.transpose(1, 2)).contiguous()}
    if _latent_out(block) is not None:  # routed rows are fc2 @ latent columns: only the shared expert's are written
        require(
            torch.allclose(values[: n_exp * d], ExpertsDown(block, sh).weight[: n_exp * d]),
            "a routed latent row changed",
        )
        out = {}
    if sh is not None:
        names = {id(p): n.replace("._original_component", "") for n, p in hf.named_parameters()}
        out[names[id(sh.down_proj.weight)]] = values[n_exp * d :].T.contiguous()
    return out
