"""Per attention head: exact activation patching and attribution patching (AtP) of the same ablation.

The metric is the mean over the data of p(target's first token) at the last prompt position. A
head's output is its node output in the circuit graph (``z_h @ W_O[h]``, :mod:`capinterp.circuits.forward`);
ablating the head replaces that output, at every position, by its reference ``ref_h`` (0 for zero
ablation, its mean over the data's real positions for mean ablation, first positions apart, or its
value on the example's corrupted prompt for ``ablation="corrupt"``, the patching of the AtP* and RelP
papers: ``data`` is then a list of :class:`~capinterp.circuits.eap.Pair`, or facts whose subject swaps
:func:`~capinterp.circuits.eap.make_pairs` finds). Both quantities go through
:func:`~capinterp.circuits.forward.run_graph`:

* **exact**: ``effect(h) = m(clean) - m(head h ablated)``, one graph pass per head with every
  outgoing edge of h removed (every downstream slot then reads the residual with ``a_h`` replaced
  by ``ref_h``, which is the head's output patched in the residual stream);
* **AtP** (Nanda 2023; Kramar et al. 2024): the first-order estimate
  ``sum_t (a_h - ref_h) . dm/da_h``, where ``dm/da_h`` is the sum of the gradients at the slots the
  head feeds (each slot reads the sum of its upstream outputs, so this is the chain rule). One
  forward and one backward pass give every head.
* **AtP*** corrections (Kramar et al. 2024): the QK fix (:func:`head_atp_qk`) and GradDrop
  (:func:`head_atp_graddrop`).

Scores are ``[n_layers, n_heads]`` float64 arrays, averaged over the data.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from capinterp.arch.family import family_of, require_fixed_heads
from capinterp.arch.layer_extras import require_additive_layers
from capinterp.arch.model import attention_layers, require_attention_layers
from capinterp.arch.pattern_writes import require_pattern_writes
from capinterp.circuits.eap import Pair, make_pairs
from capinterp.circuits.forward import GraphRun, graph_mode, mean_outputs, run_graph
from capinterp.circuits.graph import Graph
from capinterp.circuits.head_stair import stair_head_probs, stair_route
from capinterp.core import validate
from capinterp.core.position_mean import batch_rows
from capinterp.core.protocol import Model
from capinterp.core.tokens import Encoded, batches, encode, pad_id, pad_right

__all__ = [
    "HEAD_ABLATIONS",
    "HEAD_ROUTES",
    "HeadRuns",
    "HeadStep",
    "batch_ref",
    "head_atp",
    "head_atp_graddrop",
    "head_atp_qk",
    "head_effects",
    "head_sources",
    "qk_slots",
]

HEAD_ABLATIONS = ("zero", "mean", "corrupt")


def head_sources(graph: Graph) -> list[int]:
    """Source indices of every head, layer-major (``[i * H + h]`` is head ``h`` of the ``i``-th layer
    with attention: of layer ``i`` but on a hybrid model, whose other layers have no heads)."""
    return [graph.head_src(l, h) for l in graph.head_layers for h in range(graph.n_heads)]


def per_layer(graph: Graph, flat: torch.Tensor) -> np.ndarray:
    """``[n_heads_total]`` values (:func:`head_sources` order) -> ``[n_layers, n_heads]``, NaN in the
    rows of a hybrid model's layers without attention."""
    out = np.full((graph.n_layers, graph.n_heads), np.nan)
    out[graph.head_layers] = flat.numpy().reshape(-1, graph.n_heads)
    return out


def _items(model: Model, data: Any, ablation: str = "zero") -> tuple[list[Encoded], list[list[int]] | None]:
    """The encoded examples, and with ``ablation="corrupt"`` each one's corrupted prompt+target ids."""
    if not data:
        raise ValueError("head patching needs at least one example")
    if ablation == "corrupt":
        pairs = data if isinstance(data[0], Pair) else make_pairs(model, validate.examples(data, need_target=True))
        noise = sum(p.mode == "noise" for p in pairs)
        if noise:
            raise ValueError(
                f"ablation='corrupt' needs a corrupted prompt of the same token length for every example; {noise} "
                f"of {len(pairs)} have none (pass Pairs from make_pairs(model, data, corrupt=...))"
            )
        return [p.clean for p in pairs], [list(p.corrupt_ids) for p in pairs]
    if isinstance(data[0], Pair):
        raise ValueError(f"Pairs of clean and corrupted prompts are for ablation='corrupt', not {ablation!r}")
    items = data if isinstance(data[0], Encoded) else encode(model, validate.examples(data, need_target=True))
    return items, None


def _chunks(items: list[Encoded], corrupt: list[list[int]] | None, bs: int) -> Iterator[tuple[list, list | None]]:
    """Batches of items, each with its corrupted ids (None without)."""
    for s in range(0, len(items), bs):
        yield items[s : s + bs], None if corrupt is None else corrupt[s : s + bs]


def _batch(model: Model, chunk: list[Encoded]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    dev = next(model.parameters()).device
    tokens, lengths = pad_right([it.ids for it in chunk], pad_id(model.tokenizer))
    last = torch.tensor([it.last_prompt_pos for it in chunk], device=dev)
    target = torch.tensor([it.target_ids[0] for it in chunk], device=dev)
    return tokens.to(dev), last, target


def _prob(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """p(target) per row from ``[B, d_vocab]`` logits (a run's ``at=`` its last prompt positions)."""
    return logits.float().softmax(-1)[torch.arange(len(target), device=logits.device), target]


def _reference(model: Model, graph: Graph, items: list[Encoded], ablation: str, bs: int) -> torch.Tensor | None:
    """``[2, n_src, d]`` mean node outputs over the real positions (mean ablation: first positions
    apart from the later ones, :mod:`capinterp.core.position_mean`), None for zero and corrupt."""
    if ablation != "mean":
        return None
    batched = ((_batch(model, chunk)[0], torch.tensor([len(it.ids) for it in chunk])) for chunk in batches(items, bs))
    return mean_outputs(model, graph, batched)


def _ref_rows(ref: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """``[batch, pos, n_src, d]``: each position's mean (:func:`_reference`) for a batch of ``tokens``."""
    return batch_rows(ref, *tokens.shape)


def batch_ref(
    model: Model, graph: Graph, ref: torch.Tensor | None, tokens: torch.Tensor, corrupt: list | None
) -> torch.Tensor | None:
    """The ``[B, T, n_src, d]`` values ablated nodes take in this batch: None (zero), the position
    means (mean) or the node outputs of the corrupted prompts (corrupt; call inside graph mode)."""
    if corrupt is not None:
        bad, _ = pad_right(corrupt, pad_id(model.tokenizer))
        with torch.no_grad():
            return run_graph(model, graph, bad.to(tokens.device), logits=False).outputs.float()
    return None if ref is None else _ref_rows(ref, tokens)


def _setup(model: Model, data: Any, ablation: str, batch_size: int, graph: Graph | None):
    ablation = validate.choice("ablation", ablation, HEAD_ABLATIONS)
    bs = validate.positive_int("batch_size", batch_size)
    require_fixed_heads(family_of(model), "attention-head patching")
    # a graph passed in skips Graph.from_model: per-layer embeddings and layer scales are served there too
    require_additive_layers(model, "attention-head patching", served=("ple", "scaled"))
    require_attention_layers(model, "attention-head patching")
    graph = graph or Graph.from_model(model)
    items, corrupt = _items(model, data, ablation)
    return items, corrupt, ablation, bs, graph


HEAD_ROUTES = ("auto", "stair", "graph")


def head_effects(
    model: Model,
    data: Any,
    *,
    ablation: str = "zero",
    batch_size: int = 16,
    graph: Graph | None = None,
    route: str = "auto",
) -> np.ndarray:
    """``[n_layers, n_heads]`` exact effects ``m(clean) - m(head ablated)`` (see the module docstring);
    NaN rows for a hybrid model's layers without attention.

    ``route``: ``"stair"`` reuses the clean run below each head's layer and computes logits at the
    answer only (:mod:`capinterp.circuits.head_stair`); ``"graph"`` runs one full graph pass per head;
    ``"auto"``: the stair where :func:`~capinterp.circuits.head_stair.stair_route` allows it."""
    route = validate.choice("route", route, HEAD_ROUTES)
    items, corrupt, ablation, bs, graph = _setup(model, data, ablation, batch_size, graph)
    stair = stair_route(model, graph)
    if route == "stair" and not stair:
        raise ValueError(f"route='stair' does not cover this model ({family_of(model).name}); use 'auto' or 'graph'")
    srcs = head_sources(graph)
    total = torch.zeros(len(srcs), dtype=torch.float64)
    with graph_mode(model, graph):
        ref = _reference(model, graph, items, ablation, bs)
        with torch.no_grad():
            for chunk, bad in _chunks(items, corrupt, bs):
                tokens, last, target = _batch(model, chunk)
                run = run_graph(model, graph, tokens, at=last)
                r = batch_ref(model, graph, ref, tokens, bad)
                if route != "graph" and stair:
                    idx = torch.tensor(srcs, device=tokens.device)
                    delta = run.outputs[:, :, idx].float() - (0 if r is None else r[:, :, idx])
                    for b, it in enumerate(chunk):
                        clean, patched = stair_head_probs(model, graph, it, delta[b, : len(it.prompt_ids)])
                        total += clean - patched
                    continue
                full = _prob(run.logits, target)
                for i, s in enumerate(srcs):
                    removed = torch.zeros(graph.n_src, graph.n_slots, dtype=torch.bool)
                    removed[s] = True
                    abl = _prob(run_graph(model, graph, tokens, removed=removed, ref=r, at=last).logits, target)
                    total[i] += (full - abl).double().sum().cpu()
    return per_layer(graph, total / len(items))


class HeadRuns:
    """The set-up every head estimator shares, and per batch one graph run with the slots kept.

    Iterating yields a :class:`HeadStep` per batch (inside :func:`graph_mode`); :meth:`result` turns
    the accumulated ``[n_heads_total]`` sums into the ``[n_layers, n_heads]`` mean over the data.
    ``patterns``: also capture every layer's attention pattern live (``step.patterns``).
    """

    def __init__(
        self, model: Model, data: Any, ablation: str, batch_size: int, graph: Graph | None, patterns: bool = False
    ):
        self.items, self.corrupt, self.ablation, self.bs, self.graph = _setup(model, data, ablation, batch_size, graph)
        self.model, self.patterns = model, patterns
        self.srcs = head_sources(self.graph)
        self.feeds = self.graph.edge_mask[torch.tensor(self.srcs)].float()  # [n_heads_total, n_slots]

    def __iter__(self) -> Iterator[HeadStep]:
        model, graph = self.model, self.graph
        with graph_mode(model, graph):
            ref = _reference(model, graph, self.items, self.ablation, self.bs)
            for chunk, bad in _chunks(self.items, self.corrupt, self.bs):
                tokens, last, target = _batch(model, chunk)
                pats: dict[int, torch.Tensor] = {}
                grab = _pattern_hooks(model, graph.head_layers, pats) if self.patterns else contextlib.nullcontext()
                with torch.enable_grad(), grab:
                    run = run_graph(model, graph, tokens, keep_slots=True, at=last)
                    metric = _prob(run.logits, target).sum()
                idx = torch.tensor(self.srcs, device=tokens.device)
                diff = run.outputs[:, :, idx].float()
                ref_full = batch_ref(model, graph, ref, tokens, bad)
                if ref_full is not None:
                    diff = diff - ref_full[:, :, idx.to(ref_full.device)]
                yield HeadStep(len(chunk), tokens, run, metric, diff, ref_full, dict(sorted(pats.items())))

    def result(self, total: torch.Tensor) -> np.ndarray:
        return per_layer(self.graph, total / len(self.items))


@dataclass
class HeadStep:
    """One batch of :class:`HeadRuns`: the graph run (grad on), its metric and ``a_h - ref_h``."""

    n: int
    tokens: torch.Tensor
    run: GraphRun
    metric: torch.Tensor  # sum over the batch of p(target)
    diff: torch.Tensor  # [B, T, n_heads_total, d]: a_h - ref_h
    ref_full: torch.Tensor | None  # [B, T, n_src, d] reference for removal passes (None: zero)
    patterns: dict[int, torch.Tensor]  # live attention patterns by layer (HeadRuns(patterns=True))

    def grads(self, extra: Sequence[torch.Tensor] = (), retain: bool = False) -> list[torch.Tensor]:
        """``[dm/dslots as [B, T, n_slots, d], *dm/d(extra)]``, zeros where the metric does not depend."""
        live = [*self.run.slot_inputs, *extra]
        with torch.enable_grad():
            raw = torch.autograd.grad(self.metric, live, retain_graph=retain, allow_unused=True)
        g = [torch.zeros_like(t) if gi is None else gi for gi, t in zip(raw, live)]
        n = len(self.run.slot_inputs)
        return [self.run.stack_slots(g[:n]), *g[n:]]

    def estimate(self, grads: torch.Tensor, feeds: torch.Tensor, per_item: bool = False) -> torch.Tensor:
        """``sum_t (a_h - ref_h) . sum_{slots v h feeds} dm/dv``: ``[n_heads_total]`` (or ``[B, n]``)."""
        d_head = torch.einsum("btvd,nv->btnd", grads.float(), feeds.to(grads.device))
        return torch.einsum("btnd,btnd->bn" if per_item else "btnd,btnd->n", self.diff, d_head).double().cpu()


def head_atp(
    model: Model, data: Any, *, ablation: str = "zero", batch_size: int = 16, graph: Graph | None = None
) -> np.ndarray:
    """``[n_layers, n_heads]`` AtP estimates ``sum_t (a_h - ref_h) . dm/da_h`` of :func:`head_effects`."""
    runs = HeadRuns(model, data, ablation, batch_size, graph)
    total = torch.zeros(len(runs.srcs), dtype=torch.float64)
    for step in runs:
        total += step.estimate(step.grads()[0], runs.feeds)
    return runs.result(total)


def _pattern_hooks(model: Model, layers: list[int], store: dict[int, torch.Tensor]):
    def grab(l: int):
        def fn(x: torch.Tensor, hook: Any) -> torch.Tensor:
            store[l] = x
            return x

        return fn

    return model.hooks(fwd_hooks=[(f"blocks.{l}.attn.hook_pattern", grab(l)) for l in layers])


class _PatternReady(Exception):
    """Raised by the hook that has the pattern it needs: the rest of the forward is not run."""


def _pattern_only(
    model: Model, graph: Graph, tokens: torch.Tensor, layer: int, removed: torch.Tensor, ref: torch.Tensor | None
) -> torch.Tensor:
    """Layer ``layer``'s attention pattern in a graph pass with ``removed`` edges; the pass stops there
    (the later layers and the unembedding, most of the cost on a large vocabulary, are skipped)."""
    got: dict[str, torch.Tensor] = {}

    def grab(x: torch.Tensor, hook: Any) -> None:
        got["pattern"] = x
        raise _PatternReady

    try:
        with model.hooks(fwd_hooks=[(f"blocks.{layer}.attn.hook_pattern", grab)]):
            run_graph(model, graph, tokens, removed=removed, ref=ref)
    except _PatternReady:
        pass
    return got["pattern"]


def head_atp_qk(
    model: Model, data: Any, *, ablation: str = "zero", batch_size: int = 16, graph: Graph | None = None
) -> np.ndarray:
    """AtP* with the attention-saturation (QK) fix, ``[n_layers, n_heads]`` (Kramar et al. 2024).

    As :func:`head_atp`, except for the paths through the queries and keys of later heads: there,
    instead of linearizing through the softmax, the later layer's attention pattern is recomputed
    with head h's output ablated in its q and k inputs only (a graph pass with those edges removed),
    and its change is weighted by ``dm/dpattern`` of the clean run. Values, MLPs and the logits stay
    first order. Costs one forward up to the later layer per (head, later layer): for small models
    and checks, not sweeps.
    Needs q/k/v input slots (granularity ``"qkv"``), and a pattern hook on the output's path
    (:func:`~capinterp.arch.pattern_writes.require_pattern_writes`: refused where the bridge's hook only observes).
    """
    # its correction is the pattern's gradient: 0 where the hooked pattern is not on the output's path
    require_pattern_writes(model, attention_layers(model)[1:], "AtP*'s QK fix")
    runs = HeadRuns(model, data, ablation, batch_size, graph, patterns=True)
    graph = runs.graph
    if graph.granularity != "qkv":
        raise NotImplementedError(
            f"the QK fix needs separate q/k/v input slots; this model's graph has granularity {graph.granularity!r}"
        )
    H, att = graph.n_heads, graph.head_layers
    qk = qk_slots(graph)
    feeds = runs.feeds * (~qk[None]).float()  # linear paths: v, MLPs, logits
    total = torch.zeros(len(runs.srcs), dtype=torch.float64)
    for step in runs:
        grads, *pat_grads = step.grads(list(step.patterns.values()))
        g_pat = dict(zip(step.patterns, pat_grads))
        total += step.estimate(grads, feeds)
        with torch.no_grad():
            for i, s in enumerate(runs.srcs):
                for l2 in att[i // H + 1 :]:
                    removed = torch.zeros(graph.n_src, graph.n_slots, dtype=torch.bool)
                    for kind in ("q", "k"):
                        removed[s, graph.slot_index(l2, kind)] = True
                    new = _pattern_only(model, graph, step.tokens, l2, removed, step.ref_full)
                    delta = (new - step.patterns[l2].detach()).float()
                    total[i] -= float((g_pat[l2].float() * delta).sum())  # effect = clean - ablated
    return runs.result(total)


def qk_slots(graph: Graph) -> torch.Tensor:
    """Bool ``[n_slots]``: the query and key input slots (granularity ``"qkv"``; none otherwise)."""
    qk = torch.zeros(graph.n_slots, dtype=torch.bool)
    if graph.granularity == "qkv":
        for l in graph.head_layers:
            qk[graph.slot_index(l, "q")] = True
            qk[graph.slot_index(l, "k")] = True
    return qk


def head_atp_graddrop(
    model: Model, data: Any, *, ablation: str = "zero", batch_size: int = 16, graph: Graph | None = None
) -> np.ndarray:
    """AtP* GradDrop, ``[n_layers, n_heads]``: ``mean_x (1/(L-1)) sum_l |I_AtP+GD_l(h; x)|``.

    Kramar, Lieberum, Shah, Nanda (2024), "AtP*: An efficient and scalable method for localizing LLM
    behaviour to components", arXiv:2403.00745, section 3.1.2 (GradDrop, their eq. 11): for every
    layer ``l``, ``I_AtP+GD_l(h; x)`` is the AtP estimate of prompt ``x`` computed with the gradient
    through layer ``l``'s residual contribution set to zero (the backward pass skips block ``l``, its
    skip connection stays); the estimate is the mean over prompts of ``1/(L-1)`` times the sum over
    the ``L`` layers of its absolute values. Dropping the head's own layer zeroes its gradient, so
    this is the mean over the other ``L - 1`` layers. Unsigned, as in the paper: compare it with the
    magnitude of the exact effect. One forward and ``L`` backward passes per batch.
    """
    runs = HeadRuns(model, data, ablation, batch_size, graph)
    g, H = runs.graph, runs.graph.n_heads
    L = g.n_layers
    if L < 2:
        raise ValueError("GradDrop needs at least two layers (it averages over the L - 1 other layers)")
    total = torch.zeros(len(runs.srcs), dtype=torch.float64)
    for step in runs:
        firsts = [0]
        for t in step.run.slot_inputs[:-1]:
            firsts.append(firsts[-1] + (t.shape[2] if t.dim() == 4 else 1))
        per_item = torch.zeros(step.n, len(runs.srcs), dtype=torch.float64)
        for l in range(L):
            sl = g.layer_slots(l)  # the slots of block l (attention, mixer, MLP)
            in_l = [i for i, f in enumerate(firsts) if sl.start <= f < sl.stop]
            handles = [step.run.slot_inputs[i].register_hook(torch.zeros_like) for i in in_l]
            try:
                grads = step.grads(retain=True)[0]
            finally:
                for hd in handles:
                    hd.remove()
            grads[:, :, sl] = 0  # no gradient through block l
            est = step.estimate(grads, runs.feeds, per_item=True)
            if g.has_heads(l):  # block l's own heads: their contribution's gradient is 0
                i = g.head_layers.index(l)
                est[:, i * H : (i + 1) * H] = 0
            per_item += est.abs()
        total += per_item.sum(0) / (L - 1)
    return runs.result(total)
