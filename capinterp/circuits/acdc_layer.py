"""ACDC's edge trials run from the tried slot's layer up (route ``"layer"`` of :func:`~capinterp.circuits.acdc.acdc`).

ACDC visits slots in reverse topological order and only ever changes the removals into the slot it
visits. While the slots of layer ``l`` are tried, the removals into every slot below layer ``l`` are
therefore still those of the start (none, or the edges outside ``candidates``), and everything a
block below ``l`` computes (its input residual, every node output below layer ``l``) equals the
pass made at the start with those removals. That pass is recorded once per batch of facts (each
block's input and call arguments, as :func:`capinterp.kernels.prefix.clean_suffix` records them,
and the node outputs of the graph), and each trial calls the blocks of layers ``l .. L-1`` directly
(hooks fire: they are the bridge's blocks) with the graph's hooks, starting from the recorded
residual and node outputs. The final slot (``logits``) is applied by hand, and logits are computed
at the answer positions only, which are all MatchNLL reads. A trial at layer ``l`` costs ``L - l``
blocks instead of ``L``, and the answer positions' unembedding instead of every position's.

:func:`layer_route` says where this applies (one residual stream, no layer scales, no per-layer
embeddings, no hybrid mixers, no windowed module attention); the tests check that it gives the
full route's decisions and deltas.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch
from einops import rearrange

from capinterp.arch.family import family_of
from capinterp.arch.forward import unembed
from capinterp.arch.layer_extras import ple_layers, stream_scales
from capinterp.circuits.forward import _GraphPass, run_graph
from capinterp.circuits.graph import Graph
from capinterp.core.protocol import Model
from capinterp.core.tokens import EncodedBatch
from capinterp.kernels import prefix as px

__all__ = ["LayerTrials", "layer_route", "slot_layer"]


def layer_route(model: Model, graph: Graph) -> bool:
    """Can ACDC's trials start at the tried slot's layer on this model (see the module docstring)?"""
    fam = family_of(model)
    return (
        not fam.hybrid_layers
        and not graph.kinds
        and fam.residual_streams == 1
        and fam.altup_streams == 1
        and fam.module_window is None
        and not ple_layers(model)
        and all(p == 1.0 for p in stream_scales(model))
    )


def slot_layer(graph: Graph, j: int) -> int:
    """The layer whose blocks compute slot ``j``'s input (``n_layers`` for ``logits``)."""
    for l in range(graph.n_layers):
        if j < graph.layer_slots(l).stop:
            return l
    return graph.n_layers


@dataclass
class _Recorded:
    """One batch's pass with the start's removals."""

    tokens: torch.Tensor
    resid: list[torch.Tensor]  # per block its input hidden; last, the last block's output
    calls: list[tuple[tuple, dict]]  # per block (other positional args, kwargs), KV cache taken out
    outs: torch.Tensor  # [n_src, B, T, d] node outputs
    rows: torch.Tensor  # [N] batch row of each target token
    pos: torch.Tensor  # [N] its position
    targets: torch.Tensor  # [N] its id


def _record(model: Model, graph: Graph, batch: EncodedBatch, removed: torch.Tensor) -> tuple[_Recorded, torch.Tensor]:
    """Run the graph pass once with ``removed``, recording what the trials start from; also its logits."""
    L = len(model.blocks)
    resid: list[Any] = [None] * (L + 1)
    calls: list[Any] = [None] * L

    def pre(j: int, module: Any, args: tuple, kwargs: dict) -> None:
        if calls[j] is not None:
            raise px.Unsupported(f"block {j} ran twice in one forward")
        hidden, rest, kw = px._split_call(module, args, kwargs)
        if px._SHARED_KV in kw:
            raise px.Unsupported("layers that share keys and values")
        resid[j], calls[j] = hidden.detach().clone(), (rest, kw)

    def post(module: Any, args: tuple, out: Any) -> None:
        resid[L] = (out[0] if isinstance(out, (tuple, list)) else out).detach().clone()

    handles = [
        blk.register_forward_pre_hook(functools.partial(pre, j), with_kwargs=True) for j, blk in enumerate(model.blocks)
    ]
    handles.append(model.blocks[L - 1].register_forward_hook(post))
    try:
        run = run_graph(model, graph, batch.tokens, removed=removed)
    finally:
        for h in handles:
            h.remove()
    if any(r is None for r in resid):
        raise px.Unsupported("some blocks did not run as modules of the bridge")
    dev = batch.tokens.device
    rows = [b for b, it in enumerate(batch.items) for _ in it.answer_positions]
    pos = [p for it in batch.items for p in it.answer_positions]
    tgt = [t for it in batch.items for t in it.target_ids]
    outs = rearrange(run.outputs, "b t n d -> n b t d").clone()
    as_t = functools.partial(torch.tensor, device=dev, dtype=torch.long)
    return _Recorded(batch.tokens, resid, calls, outs, as_t(rows), as_t(pos), as_t(tgt)), run.logits


class LayerTrials:
    """The recorded start of every batch, and trials from a layer up (call inside ``graph_mode``)."""

    def __init__(self, model: Model, graph: Graph, chunks: list[EncodedBatch], removed: torch.Tensor) -> None:
        self.model, self.graph = model, graph
        self.recorded: list[_Recorded] = []
        self.start_logits: list[torch.Tensor] = []
        for b in chunks:
            rec, logits = _record(model, graph, b, removed)
            self.recorded.append(rec)
            self.start_logits.append(logits)

    def nll(self, removed: torch.Tensor, l: int) -> torch.Tensor:
        """Per-target-token NLL with ``removed``, which must equal the start's on every slot below layer ``l``."""
        return torch.cat([self._nll_one(rec, removed, l) for rec in self.recorded])

    def _nll_one(self, rec: _Recorded, removed: torch.Tensor, l: int) -> torch.Tensor:
        model, graph = self.model, self.graph
        gp = _GraphPass(model, graph, rec.tokens, resid0=None, removed=removed, ref=None, keep_slots=False)
        gp.outs = rec.outs.clone()
        final = graph.n_slots - 1
        hooks = gp.hooks()[:-1]  # the final slot is applied below, on the answer positions' rows only
        h = rec.resid[l]
        with model.hooks(fwd_hooks=hooks):
            for j in range(l, graph.n_layers):
                rest, kw = rec.calls[j]
                kw = dict(kw)
                cache_arg = kw.pop(px._CACHE_ARG, "past_key_values")
                out = model.blocks[j](h, *rest, **kw, **{cache_arg: px._PrefixKV({})})
                h = out[0] if isinstance(out, (tuple, list)) else out
        x = gp.on_slot(slice(final, final + 1), graph.n_layers, h, None)
        logits = unembed(model, x[rec.rows, rec.pos][None])[0]
        logp = torch.log_softmax(logits.float(), dim=-1)
        return -logp[torch.arange(len(rec.targets), device=logp.device), rec.targets]
