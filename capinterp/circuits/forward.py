"""Running a model on its edge graph: captured node outputs, per-edge ablation, circuit-only Hit@k.

:func:`run_graph` is the one forward pass everything else uses. It records every node's output
as it is computed (``[batch, pos, n_src, d_model]``) and, at every input slot, subtracts the
contributions of the *removed* edges from what the slot reads::

    input(v) = resid(v) - sum_{u: (u, v) removed} (a_u - ref_u)

where ``a_u`` is u's output in this same pass (so ablations compound downstream, as in ACDC) and
``ref_u`` is 0 (zero ablation, the default) or a reference activation (``ref=`` e.g. the outputs of
a corrupted run: "patching" the edge). Only the slot's own input changes; the residual stream
itself is untouched, so each edge is ablated on its own. The residual stream at a slot equals the
sum of the upstream outputs (checked in the tests), so removing every edge into a slot leaves only
the constant biases there.

Post-norm blocks (Gemma 2/3: a norm on the attention and MLP outputs before they join the residual
stream): an MLP's output is its post-norm output; a head's output is its share of the normalized
attention output, ``gain * result_h / rms(sum_h result_h)`` with the actual sum's scale, so the
shares add up to what enters the residual stream exactly (the RMS scale is the one nonlinear
coupling left between heads of a layer, as a layer norm's scale is for every node's input).
:func:`check_additive` verifies the decomposition on a model before anything is scored.

Layer scales (Gemma 4's ``layer_scalar``, which multiplies the whole residual stream at a layer's end): a
node of layer ``l`` reaches a reader of layer ``k`` times ``P[k] / P[l]``, ``P[l]`` the product of the scales
before layer ``l``. Node outputs and slot inputs are kept in the stream's scale at layer 0 (an output
divided by its layer's ``P``, a slot's input by its own, and multiplied back when it enters the model),
so the sums, the removed edges and the slots' gradients above hold unchanged.

Families differ in which bridge hooks fire; :mod:`capinterp.circuits.probe` finds out once per
model and picks the routes: per-head outputs from ``hook_result`` or rebuilt from the output
projection's input (z_h @ W_O[h], scaled by the family record's residual multiplier); the MLP slot
from ``hook_mlp_in``, ``ln2.hook_in``, or, in a parallel block sharing one norm, as ``ln1(slot)``
fed to the MLP; ``"layer"`` attention slots likewise.

Circuit-only evaluation (Yao et al.): every edge outside the circuit is ablated (zero by default;
mean or corrupted-run values on request), then the target's rank at the last prompt position gives
Hit@1 / Hit@10. Ranks count ties against the target, so a fully ablated model (all logits equal)
scores 0.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from einops import rearrange

from capinterp.arch.family import family_of
from capinterp.arch.forward import capture, unembed
from capinterp.arch.layer_extras import ple_layers, stream_scales
from capinterp.arch.model import layer_mixers, mixer_module
from capinterp.circuits.graph import INPUT, LOGITS, Graph, supports
from capinterp.circuits.probe import Routes, routes
from capinterp.core.position_mean import SplitMean
from capinterp.core.protocol import Model

__all__ = [
    "GraphRun",
    "Routes",
    "check_additive",
    "graph_mode",
    "mean_outputs",
    "node_params",
    "run_graph",
    "supports",
]

_FLAGS = ("use_attn_result", "use_split_qkv_input", "use_attn_in", "use_hook_mlp_in")


@contextlib.contextmanager
def graph_mode(model: Model, graph: Graph) -> Iterator[None]:
    """Turn on the hooks the graph needs (per-head results, split inputs, mlp_in); restore after."""
    before = {f: bool(getattr(model.cfg, f, False)) for f in _FLAGS}
    split = {"qkv": "use_split_qkv_input", "head": "use_attn_in"}.get(graph.granularity)
    try:
        if routes(model, graph.parallel).result == "result":
            model.set_use_attn_result(True)
        for other in ("use_split_qkv_input", "use_attn_in"):
            if before[other] and other != split:
                getattr(model, f"set_{other}")(False)
        if split is not None:
            try:
                getattr(model, f"set_{split}")(True)
            except NotImplementedError as err:
                hint = (
                    "build the graph with granularity='layer' (one attention input per layer)"
                    if graph.granularity == "qkv"
                    else "this model exposes no per-head attention input"
                )
                raise NotImplementedError(f"{split} is not supported by this model ({err}); {hint}") from err
        elif not all(routes(model, graph.parallel).layer_attn[l] for l in graph.head_layers):
            raise NotImplementedError("this model fires no hook before its attention norm: granularity='layer' fails")
        try:
            model.set_use_hook_mlp_in(True)
        except (NotImplementedError, ValueError):
            pass  # the MLP slot then comes from ln2's or the MLP's own input (probe.routes)
        yield
    finally:
        for f in _FLAGS:  # first switch off what was off (split and attn_in exclude each other) ...
            if not before[f] and bool(getattr(model.cfg, f, False)):
                getattr(model, f"set_{f}")(False)
        for f in _FLAGS:  # ... then back on what was on
            if before[f] and not bool(getattr(model.cfg, f, False)):
                getattr(model, f"set_{f}")(True)


def node_params(model: Model, graph: Graph) -> dict[str, int]:
    """Parameters each node owns: a head 1/H of its layer's attention (+ ln1 and a post-attention norm),
    a hybrid layer's mixer its weights (+ ln1, which it shares with Falcon-H1's attention), Gemma 4's
    per-layer-embedding node its gate, projection and norm, the MLP
    every other parameter of the block (its weights, ln2, a post-FFN norm, Granite 4.0's shared MLP);
    the nodes add up to the blocks' parameters up to the remainder of a layer's attention over its heads.

    ``input`` and ``logits`` own 0: every circuit touches them, and counting the embedding and
    unembedding matrices would swamp the share (CNL's 1.6-2.6 % counts components only).
    """

    def params(*mods: Any) -> dict[int, int]:
        return {id(p): p.numel() for m in mods if m is not None for p in m.parameters()}

    out = {INPUT: 0, LOGITS: 0}
    for l in range(graph.n_layers):
        blk = model.blocks[l]
        ln1 = getattr(blk, "ln1", None)
        mixer = params(getattr(blk, str(mixer_module(model, l)), None), ln1) if graph.has_mixer(l) else {}
        attn = {}
        if graph.has_heads(l):
            attn = params(getattr(blk, "attn", None), ln1, getattr(blk, "ln1_post", None))
            attn = {k: v for k, v in attn.items() if k not in mixer}
            out.update({f"a{l}.h{h}": sum(attn.values()) // graph.n_heads for h in range(graph.n_heads)})
        if mixer:
            out[f"x{l}"] = sum(mixer.values())
        ple = {}
        if graph.ple:  # Gemma 4: the gate, the projection and the norm of the per-layer embedding
            parts = ("per_layer_input_gate", "per_layer_projection", "post_per_layer_input_norm")
            ple = params(*(getattr(blk, n, None) for n in parts))
            out[f"p{l}"] = sum(ple.values())
        out[f"m{l}"] = sum(v for k, v in params(blk).items() if k not in attn and k not in mixer and k not in ple)
    return out


@dataclass
class GraphRun:
    """Result of :func:`run_graph`: logits, node outputs ``[B, T, n_src, d]`` and slot inputs."""

    logits: torch.Tensor
    outputs: torch.Tensor  # a [B, T, n_src, d] view of a source-major buffer
    slot_inputs: list[torch.Tensor]  # per layer: attention slot tensors then mlp_in; then the final resid

    def stack_slots(self, tensors: Sequence[torch.Tensor]) -> torch.Tensor:
        """Tensors shaped like ``slot_inputs`` (e.g. their gradients) -> ``[B, T, n_slots, d]``."""
        return torch.cat([t if t.dim() == 4 else t.unsqueeze(2) for t in tensors], dim=2)


def run_graph(
    model: Model,
    graph: Graph,
    tokens: torch.Tensor,
    *,
    resid0: torch.Tensor | None = None,
    removed: torch.Tensor | None = None,
    ref: torch.Tensor | None = None,
    keep_slots: bool = False,
    at: torch.Tensor | None = None,
    logits: bool = True,
) -> GraphRun:
    """One forward pass on the graph (call inside :func:`graph_mode`).

    Args:
        resid0: replaces the ``input`` node's output (``[B, T, d]``), e.g. interpolated embeddings.
        removed: bool ``[n_src, n_slots]``: edges whose contribution is taken out of the slot input;
            or ``[B, n_src, n_slots]``, one set per batch row.
        ref: ``[B, T, n_src, d]`` value a removed edge's source takes instead (default 0).
        keep_slots: return the slot input tensors (the live ones, for ``torch.autograd.grad``).
        at: ``[B]`` positions: the logits of row b at ``at[b]`` only (``[B, d_vocab]``): the forward
            stops at the final norm's input and only those positions are unembedded (on a 262k
            vocabulary, most of a small model's forward).
        logits: False: no logits at all (an empty ``[B, 0]``), for a pass run for its node outputs.
    """
    _check_layers(model, graph)
    run = _GraphPass(model, graph, tokens, resid0=resid0, removed=removed, ref=ref, keep_slots=keep_slots)
    if logits and at is None:
        out = model.run_with_hooks(tokens, fwd_hooks=run.hooks())
    else:  # the final slot's hook runs first, then capture's: it reads the slot as the final norm would
        resid = capture(model, tokens, run.names["final"], run.hooks())
        out = resid.new_zeros(tokens.shape[0], 0)
        if logits and at is not None:
            rows = torch.arange(tokens.shape[0], device=resid.device)
            out = unembed(model, resid[rows, at.to(resid.device)][:, None])[:, 0]
    if keep_slots and len(run.slots) != _n_slot_hooks(graph, run.names) + 1:
        raise RuntimeError(f"only {len(run.slots)} slot hooks fired: is graph_mode on?")
    return GraphRun(out, rearrange(run.outs, "n b t d -> b t n d"), [run.slots[k] for k in sorted(run.slots)])


def _check_layers(model: Model, graph: Graph) -> None:
    """ValueError unless the graph was built for this model's layers."""
    ple = bool(ple_layers(model))
    if graph.n_layers != len(model.blocks) or graph.kinds != layer_mixers(model) or graph.ple != ple:
        raise ValueError(
            f"this graph's layers ({graph.n_layers}, kinds {graph.kinds or 'all attention'}, per-layer embeddings "
            f"{graph.ple}) are not this model's ({len(model.blocks)}, kinds {layer_mixers(model) or 'all attention'}, "
            f"per-layer embeddings {ple}): build it with Graph.from_model"
        )


def _n_slot_hooks(graph: Graph, names: dict[str, Any]) -> int:
    """How many slot hooks a pass fires before the final one (one per slot tensor)."""
    return sum(
        (
            len(graph.attn_slots(l))
            if graph.granularity == "layer" or not graph.has_heads(l)
            else len(names["attn_in"][l])
        )
        + graph.has_mixer(l)
        + 1
        + graph.ple
        for l in range(graph.n_layers)
    )


class _GraphPass:
    """The hooks of one :func:`run_graph` pass: one method per hook kind, all writing the node outputs
    (``outs``, source-major ``[n_src, B, T, d]``) and the slot inputs (``slots``) of this pass."""

    def __init__(
        self,
        model: Model,
        graph: Graph,
        tokens: torch.Tensor,
        *,
        resid0: torch.Tensor | None,
        removed: torch.Tensor | None,
        ref: torch.Tensor | None,
        keep_slots: bool,
    ) -> None:
        self.model, self.graph, self.resid0, self.keep_slots = model, graph, resid0, keep_slots
        self.names = _hooks(model, graph)
        self.fam = family_of(model)
        self.rt = routes(model, graph.parallel)
        self.gains = _post_attn_gains(model, graph)
        self.w_o = _head_out_weights(model, graph) if self.rt.result == "z" else {}
        self.B, self.T = tokens.shape
        d = int(model.cfg.d_model)
        self.dtype = next(model.parameters()).dtype
        self.P = stream_scales(model)  # P[l]: the scale the residual entering layer l carries (Gemma 4's layer_scalar)
        self.outs = torch.zeros(graph.n_src, self.B, self.T, d, dtype=self.dtype, device=tokens.device)  # matmuls
        self.ref_n = None if ref is None else rearrange(ref, "b t n d -> n b t d").to(self.dtype).contiguous()
        self.slots: dict[int, torch.Tensor] = {}  # first slot column -> the slot's input tensor
        self.pre: dict[int, torch.Tensor] = {}  # block inputs, where a slot is rebuilt as ln1(slot)
        rem = None if removed is None else (removed.bool() & graph.edge_mask).to(tokens.device)
        self.rem = None if rem is not None and not rem.any() else rem
        self.H = graph.n_heads

    def hooks(self) -> list[tuple[str, Any]]:
        """``(hook name, function)`` of every node output and slot, in the order they must run."""
        graph = self.graph
        hooks: list[tuple[str, Any]] = [(self.names["input"], self.on_input)]
        for l in range(graph.n_layers):
            hooks += self._layer_hooks(l)
        final = slice(graph.n_slots - 1, graph.n_slots)
        hooks.append((self.names["final"], partial(self.on_slot, final, graph.n_layers)))
        return hooks

    def _layer_hooks(self, l: int) -> list[tuple[str, Any]]:
        graph, rt, names = self.graph, self.rt, self.names
        layer = graph.granularity == "layer"
        mixer = mixer_module(self.model, l) if graph.has_mixer(l) else None
        hooks: list[tuple[str, Any]] = []
        if l and ("norm" in (rt.mlp[l], rt.layer_attn[l] if layer else "") or mixer):
            hooks.append((f"blocks.{l}.hook_resid_pre", partial(self.on_pre, l)))
        if graph.has_heads(l):
            hooks += self._attn_slot_hooks(l, layer, mixer)
            if rt.result == "result":
                hooks.append((names["result"][l], partial(self.on_result, l)))
            else:
                hooks.append((f"blocks.{l}.attn.o.hook_in", partial(self.on_z, l)))
        if mixer is not None:  # its slot: the residual before the mixer's norm; beside heads, ln1(slot) into it
            cols = graph.slot_index(l, "mixer")
            if graph.has_heads(l):
                hooks.append((f"blocks.{l}.{mixer}.hook_in", self._norm_slot(l, cols)))
            else:
                hooks.append((f"blocks.{l}.ln1.hook_in", partial(self.on_slot, cols, l)))
        mlp_cols = graph.slot_index(l, "mlp")
        if rt.mlp[l] == "norm":
            hooks.append((f"blocks.{l}.mlp.hook_in", self._norm_slot(l, mlp_cols)))
        else:
            hook = f"blocks.{l}.{rt.mlp[l]}"
            if mixer is not None:  # the residual the MLP reads, before its edges are taken out
                hooks.append((hook, partial(self.on_mixer_out, l)))
            hooks.append((hook, partial(self.on_slot, mlp_cols, l)))
        hooks.append((names["mlp_out"][l], partial(self.on_out, graph.mlp_src(l), l)))
        if l in self.gains:
            hooks.append((f"blocks.{l}.ln1_post.hook_in", partial(self.on_attn_post, l)))
        if graph.ple:  # Gemma 4: the gate reads the residual after the MLP; the norm's output joins it
            gate = partial(self.on_slot, graph.slot_index(l, "ple"), l)
            hooks.append((f"blocks.{l}.per_layer_input_gate.hook_in", gate))
            hooks.append((f"blocks.{l}.post_per_layer_input_norm.hook_out", partial(self.on_out, graph.ple_src(l), l)))
        return hooks

    def _attn_slot_hooks(self, l: int, layer: bool, mixer: Any) -> list[tuple[str, Any]]:
        """The attention's input slots of a layer with heads: per head (q/k/v or one), or one per layer."""
        graph, rt = self.graph, self.rt
        if not layer:
            return [
                (name, partial(self.on_slot, graph.slot_index(l, kind), l)) for kind, name in self.names["attn_in"][l]
            ]
        cols = graph.slot_index(l, "layer")
        if rt.layer_attn[l] != "norm" and not mixer:
            return [(f"blocks.{l}.{rt.layer_attn[l]}", partial(self.on_slot, cols, l))]
        # Falcon-H1's attention reads ln1's output times its input multiplier
        return [(f"blocks.{l}.attn.hook_in", self._norm_slot(l, cols, self.fam.attn_in_multiplier))]

    def _norm_slot(self, l: int, cols: slice, scale: float = 1.0) -> Any:
        """The hook rebuilding a module's input as ``ln1(slot) * scale``."""
        return partial(self.on_norm_slot, _raw(self.model.blocks[l].ln1), l, cols, scale)

    def subtract(self, x: torch.Tensor, cols: slice) -> torch.Tensor:
        """``x`` less the removed edges' contributions into the slot ``cols``."""
        graph, outs, ref_n = self.graph, self.outs, self.ref_n
        n_up = graph.n_upstream(cols.start)
        r = self.rem[..., :n_up, cols]  # type: ignore[index]  # called only when rem is not None
        if not r.any():
            return x
        delta = outs[:n_up] if ref_n is None else outs[:n_up] - ref_n[:n_up]
        if r.dim() == 3:  # one removal set per batch row
            sub = torch.einsum("bnk,nbtd->kbtd", r.to(self.dtype), delta)
        else:
            flat = rearrange(delta, "n b t d -> n (b t d)")
            sub = rearrange(r.T.to(self.dtype) @ flat, "k (b t d) -> k b t d", b=self.B, t=self.T)
        return x - (rearrange(sub, "k b t d -> b t k d") if x.dim() == 4 else sub[0])

    def on_input(self, x: torch.Tensor, hook: Any) -> torch.Tensor:
        x = x if self.resid0 is None else self.resid0.to(x.dtype)
        self.outs[0] = x.detach()
        self.pre[0] = x
        return x

    def on_pre(self, l: int, x: torch.Tensor, hook: Any) -> None:
        self.pre[l] = x

    def _heads(self, l: int) -> slice:
        return slice(self.graph.head_src(l), self.graph.head_src(l) + self.H)

    def on_z(self, l: int, z: torch.Tensor, hook: Any) -> None:
        """Head h adds ``z_h @ W_O[h]`` (times the family's residual multiplier)."""
        z = z.detach().reshape(self.B, self.T, self.H, -1)
        heads = torch.einsum("bthe,hed->hbtd", z, self.w_o[l].to(z.dtype))
        P = self.P
        self.outs[self._heads(l)] = heads / P[l] if P[l] != 1.0 else heads

    def on_result(self, l: int, x: torch.Tensor, hook: Any) -> None:
        scale = self.fam.attn_out_multiplier / self.P[l]
        x = x.detach() * scale if scale != 1.0 else x.detach()
        self.outs[self._heads(l)] = rearrange(x, "b t h d -> h b t d")

    def on_out(self, src: int, l: int, x: torch.Tensor, hook: Any) -> None:
        """A node's output as the residual stream of layer ``l`` receives it."""
        P = self.P
        self.outs[src] = x.detach() / P[l] if P[l] != 1.0 else x.detach()

    def on_mixer_out(self, l: int, x: torch.Tensor, hook: Any) -> None:
        """What the layer's mixer adds: resid_mid - resid_pre (less its heads, Falcon-H1); ``x`` is the
        residual the (sequential) MLP reads."""
        out = (x.detach() - self.pre[l].detach()) / self.P[l]
        if self.graph.has_heads(l):
            out = out - self.outs[self._heads(l)].sum(0)
        self.outs[self.graph.mixer_src(l)] = out

    def on_attn_post(self, l: int, x: torch.Tensor, hook: Any) -> None:
        """RMS post-norm: head h adds gain * result_h / rms(sum of heads)."""
        gain, eps = self.gains[l]
        scale = torch.rsqrt(x.detach().float().pow(2).mean(-1, keepdim=True) + eps)
        sl = self._heads(l)
        self.outs[sl] = (self.outs[sl].float() * (scale * gain)[None]).to(self.dtype)

    def on_slot(self, cols: slice, l: int, x: torch.Tensor, hook: Any) -> torch.Tensor:
        """A slot's input, less its removed edges; kept for its gradient with ``keep_slots``.

        Slots and node outputs live in the residual stream's own scale at layer 0: a slot of layer l
        reads P[l] times the sum of its upstream outputs, each taken at its own layer's scale."""
        p = self.P[l]
        if p != 1.0:
            x = x / p
        if self.rem is not None:
            x = self.subtract(x, cols)
        if self.keep_slots:
            # a fresh node: hook_mlp_in's tensor is also the residual the block adds to, and its
            # gradient would include the skip path; the slot's own gradient must not.
            x = x.view_as(x) if self.rem is not None or p != 1.0 else x.clone()
            self.slots[cols.start] = x
        return x * p if p != 1.0 else x

    def on_norm_slot(self, norm: Any, l: int, cols: slice, scale: float, x: torch.Tensor, hook: Any) -> torch.Tensor:
        """The module's input rebuilt as ``ln1(slot)`` (times ``scale``) from the block's input."""
        y = norm(self.on_slot(cols, l, self.pre[l], hook))
        return (y * scale if scale != 1.0 else y).to(x.dtype)


@torch.no_grad()
def mean_outputs(
    model: Model, graph: Graph, token_batches: Iterable[tuple[torch.Tensor, torch.Tensor]]
) -> torch.Tensor:
    """``[2, n_src, d]``: every node's mean output over the real tokens of ``(tokens, lengths)``
    batches (right-padded), first positions apart from the later ones
    (:mod:`capinterp.core.position_mean`); the mean-ablation reference of edges and heads."""
    acc = SplitMean()
    for tokens, lengths in token_batches:
        acc.add(run_graph(model, graph, tokens, logits=False).outputs, lengths)
    return acc.result()


#: check_additive's tolerance in a 16-bit dtype, relative to the largest value (about 6 bfloat16 ulps; the
#: graph's split q/k/v inputs alone move SmolLM2's bfloat16 logits by 2.5 %: rounding, not structure)
LOW_PRECISION_TOL = 0.05


@torch.no_grad()
def check_additive(model: Model, graph: Graph, tol: float | None = None) -> float:
    """Check every slot input = sum of its upstream outputs + a constant (biases), and that the graph's
    forward keeps the model's logits; return the decomposition's error.

    ``tol`` (relative to the largest value): default 1e-3 in float32 / float64, :data:`LOW_PRECISION_TOL`
    in bfloat16 / float16, whose rounding alone reaches a few 1e-3 (a structural error, such as a
    multiplier the graph leaves out, does not depend on the dtype and is caught in float32).
    Raises NotImplementedError when the residual stream does not decompose into the graph's node
    outputs on this architecture (e.g. a post-norm this module does not know).
    """
    if tol is None:
        tol = LOW_PRECISION_TOL if next(model.parameters()).dtype.itemsize < 4 else 1e-3
    toks = model.to_tokens("The capital of France is the city of Paris")
    with graph_mode(model, graph):
        run = run_graph(model, graph, toks, keep_slots=True)
    plain = model(toks).float()
    drift = float((run.logits.float() - plain).abs().amax() / plain.abs().amax().clamp_min(1e-12))
    if drift > tol:
        raise NotImplementedError(
            f"{family_of(model).name}: the circuit graph's forward (granularity {graph.granularity!r}) changes this "
            f"model's logits (relative {drift:.2g}): the bridge's hooks for it do not compute the model's forward"
        )
    slots = run.stack_slots(run.slot_inputs).float()
    cum = run.outputs.float().cumsum(2)
    idx = torch.tensor([graph.n_upstream(j) - 1 for j in range(graph.n_slots)], device=cum.device)
    res = slots - cum[:, :, idx]
    err = float((res - res[:, :1]).abs().amax() / slots.abs().amax().clamp_min(1e-12))
    if err > tol:
        raise NotImplementedError(
            f"the residual stream of this model does not decompose into the circuit graph's node outputs "
            f"(relative error {err:.2g}); edge attribution needs additive head/MLP contributions"
        )
    return err


def _raw(mod: Any) -> Any:
    """The transformers module a bridge component wraps (called without firing bridge hooks)."""
    return getattr(mod, "original_component", None) or mod


def _head_out_weights(model: Model, graph: Graph) -> dict[int, torch.Tensor]:
    """Per layer with heads ``[H, d_head, d_model]``: head h's slice of the output projection, as ``z_h @ W[h]``.

    Orientation from the family record (Conv1D stores ``[in, out]``, ``nn.Linear`` ``[out, in]``);
    scaled by the family's residual multiplier, as the block scales the attention output.
    """
    fam = family_of(model)
    out = {}
    for l in graph.head_layers:
        w = _raw(model.blocks[l].attn.o).weight.detach()
        w = w if fam.conv1d else w.T  # -> [H * d_head, d_model]
        out[l] = w.reshape(graph.n_heads, -1, w.shape[-1]) * (fam.residual_multiplier * fam.attn_out_multiplier)
    return out


def _has(model: Model, sub: str, l: int) -> bool:
    blk = model.blocks[l]
    return getattr(blk, "submodules", {}).get(sub) is not None or hasattr(blk, sub)


def _post_attn_gains(model: Model, graph: Graph) -> dict[int, tuple[torch.Tensor, float]]:
    """Per layer with heads ``(effective gain, eps)`` of an RMS post-attention norm (Gemma), where it has one.

    ``norm(x) = x * rsqrt(mean(x^2) + eps) * gain`` is linear in x for a fixed scale, so with the
    scale of the actual sum each head's share of the normalized output is exact (and they add up).
    The gain is read off the module: ``norm(ones) * sqrt(1 + eps)``.
    """
    out = {}
    with torch.no_grad():
        for l in graph.head_layers:
            if not _has(model, "ln1_post", l):
                continue
            mod = model.blocks[l].ln1_post
            raw = getattr(mod, "original_component", mod)
            eps = float(getattr(raw, "eps", 0) or getattr(raw, "variance_epsilon", 1e-6))
            ones = torch.ones(1, int(model.cfg.d_model), device=next(model.parameters()).device)
            out[l] = ((raw(ones.to(next(model.parameters()).dtype)).float() * (1 + eps) ** 0.5)[0], eps)
    return out


def _hooks(model: Model, graph: Graph) -> dict[str, Any]:
    slot = {"q": "hook_q_input", "k": "hook_k_input", "v": "hook_v_input", "head": "hook_attn_in"}
    kinds = ("head",) if graph.granularity == "head" else ("q", "k", "v")
    L = range(graph.n_layers)
    mlp_out = ["ln2_post.hook_out" if _has(model, "ln2_post", l) else "hook_mlp_out" for l in L]  # post-FFN norm
    return {
        "input": "blocks.0.hook_resid_pre",
        "result": [f"blocks.{l}.attn.hook_result" for l in L],
        "mlp_out": [f"blocks.{l}.{mlp_out[l]}" for l in L],
        "attn_in": [[(k, f"blocks.{l}.{slot[k]}") for k in kinds] for l in L],
        "final": "ln_final.hook_in",
    }
