"""Which tokens a mixture-of-experts router sends to each expert: one streamed pass for all experts.

Each forward hooks the router of every layer that holds requested experts (a PyTorch forward hook
on the router module the served MoE block calls, :class:`capinterp.arch.experts.ExpertBlock`) and
reads its choices as the block itself reads them (:meth:`ExpertBlock.choices`): per token, the
``top_k`` chosen experts and their router weights. An expert's **routing weight** at a token is
its router weight where the token was routed to it (a token that picks one expert in two slots:
the weights add, as the block adds them) and 0 elsewhere; the shared expert sees every token, its
weight being its sigmoid gate (1 where it has none). The forward stops after the last layer needed.

Per expert the pass keeps the top contexts by routing weight and the weight's statistics over
every real token (the machinery of :mod:`capinterp.cards.contexts`), how many tokens were routed
to it, their summed weight, and the routed count per token id (``[n_experts, vocab]`` integers, so
memory does not grow with the corpus). Under ``torchrun`` the texts are sharded and the ranks'
counts summed, so every rank returns the one-process result.
"""

from __future__ import annotations

import functools
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from capinterp.arch.experts import ExpertBlock, expert_block
from capinterp.arch.forward import capture
from capinterp.arch.model import move_model, neuron_hook
from capinterp.cards._act_stats import RunningStats
from capinterp.cards._act_stream import encode_texts, stream
from capinterp.cards._act_topk import RunningTopK
from capinterp.cards.contexts import ActivationStats, UnitActivations, _context
from capinterp.core import distributed as dist
from capinterp.core.protocol import Model

__all__ = ["ExpertRouting", "expert_routing", "routing_weights"]


@dataclass(frozen=True)
class ExpertRouting:
    """One expert's routing over some texts: ``acts`` (top contexts by routing weight and the
    weight's statistics over all real tokens, 0 where not routed), ``tokens`` (real tokens read),
    ``routed`` (tokens routed to it), ``weight_sum`` (their summed router weight), ``by_token``
    (``[vocab]`` routed count per token id) and ``token_totals`` (``[vocab]`` count of each token id
    in the texts, shared by all experts of one pass)."""

    unit: tuple[int, Hashable]
    acts: UnitActivations
    tokens: int
    routed: int
    weight_sum: float
    by_token: torch.Tensor
    token_totals: torch.Tensor


def routing_weights(model: Model, experts: Sequence[tuple[int, Hashable]], tokens: torch.Tensor) -> torch.Tensor:
    """``[B, T, 2 n]`` float32 for ``tokens`` ``[B, T]``: each expert's routing weight at each position
    (0 where the token was not routed to it), then 1.0 / 0.0: whether it was routed there."""
    B, T = tokens.shape
    layers = sorted({int(l) for l, _ in experts})
    seen: dict[tuple[str, int], Any] = {}
    handles = []
    for layer in layers:
        spec = _block(model, layer)
        handles.append(spec.router.register_forward_hook(functools.partial(_keep, seen, ("router", layer))))
        if spec.shared_gate is not None:
            handles.append(spec.shared_gate.register_forward_hook(functools.partial(_keep, seen, ("shared", layer))))
    try:
        with torch.no_grad():
            capture(model, tokens, neuron_hook(layers[-1]))
    finally:
        for h in handles:
            h.remove()
    n = len(experts)
    out = torch.zeros(B * T, 2 * n, dtype=torch.float32, device=tokens.device)
    for layer in layers:
        spec = _block(model, layer)
        if ("router", layer) not in seen:
            raise RuntimeError(f"the router of layer {layer} did not run in the forward: its routing cannot be read")
        weights, index, _ = spec.choices(seen[("router", layer)], B * T)
        index = index.to(tokens.device)
        dense = torch.zeros(B * T, spec.n_experts, device=tokens.device).scatter_add_(
            1, index, weights.detach().to(tokens.device, torch.float32)
        )
        hit = torch.zeros(B * T, spec.n_experts, dtype=torch.bool, device=tokens.device).scatter_(1, index, True)
        for j, (l, e) in enumerate(experts):
            if int(l) != layer:
                continue
            if e == "shared":
                gate = seen.get(("shared", layer))
                w = torch.sigmoid(gate.detach().float()).reshape(-1) if gate is not None else 1.0
                out[:, j], out[:, n + j] = w, 1.0
            else:
                out[:, j], out[:, n + j] = dense[:, int(e)], hit[:, int(e)].float()  # type: ignore[call-overload]
    return out.reshape(B, T, 2 * n)


def _block(model: Model, layer: int) -> ExpertBlock:
    spec = expert_block(model, layer)
    if not isinstance(spec, ExpertBlock):
        raise ValueError(f"layer {layer} is a dense layer: it has no experts and no router")
    return spec


def _keep(seen: dict, key: tuple[str, int], module: Any, args: Any, output: Any) -> None:
    seen[key] = output


def expert_routing(
    model: Model,
    experts: Sequence[tuple[int, Hashable]],
    texts: Sequence[str],
    *,
    k: int = 10,
    window: int = 8,
    batch_size: int = 8,
    max_tokens: int | None = None,
    device: Any = None,
    progress: bool = True,
) -> list[ExpertRouting]:
    """Each expert's :class:`ExpertRouting` over ``texts`` (checked ``(layer, expert)`` keys of served
    MoE layers; ``"shared"`` for a shared expert), in the order given."""
    ids = encode_texts(model, list(texts), max_tokens)
    move_model(model, device)
    dist.init(model.cfg.device)
    dev = torch.device(model.cfg.device)
    n, vocab = len(experts), int(model.cfg.d_vocab)
    best, stats = RunningTopK(n, k, window, dev), RunningStats(n, dev)
    counts = torch.zeros(n, vocab, dtype=torch.long, device=dev)
    totals = torch.zeros(vocab, dtype=torch.long, device=dev)
    routed, wsum = torch.zeros(n, dtype=torch.long, device=dev), torch.zeros(n, dtype=torch.float64, device=dev)
    box: dict[str, torch.Tensor] = {}

    def read(tokens: torch.Tensor) -> torch.Tensor:
        box["tokens"] = tokens
        return routing_weights(model, experts, tokens)

    for acts, real, text_index in stream(model, ids, read, batch_size, progress, "expert routing"):
        w, hit = acts[..., :n], acts[..., n:] > 0.5
        best.add(w, real, text_index)
        stats.add(w[real])
        tok, h = box["tokens"][real], hit[real]
        totals += torch.bincount(tok, minlength=vocab)[:vocab]
        counts.scatter_add_(1, tok[None].expand(n, -1), h.T.long())
        routed += h.sum(0)
        wsum += (w[real] * h).sum(0).double()
    best.merge_ranks()
    stats.merge_ranks()
    counts, totals = dist.all_reduce_sum(counts, dev), dist.all_reduce_sum(totals, dev)
    routed, wsum = dist.all_reduce_sum(routed, dev), dist.all_reduce_sum(wsum, dev)
    decode = functools.lru_cache(maxsize=None)(lambda t: model.tokenizer.decode([t]))
    n_tokens, out = int(totals.sum()), []
    for j, (unit, summary) in enumerate(zip(experts, stats.summaries())):
        contexts = tuple(
            _context(model.tokenizer, ids[t], t, p, v, around, window, decode) for v, t, p, around in best.kept(j)
        )
        acts_j = UnitActivations(unit, contexts, ActivationStats(**summary))  # type: ignore[arg-type]
        out.append(ExpertRouting(unit, acts_j, n_tokens, int(routed[j]), float(wsum[j]), counts[j].cpu(), totals.cpu()))
    return out
