"""The work each kind of fit does, counted for :mod:`capinterp.localizers.cost` (no model run).

One counter per kernel: the IG kernel's rows (:func:`ig_work`), sequential IG's (:func:`sig_work`),
batched no-grad forwards (:func:`forward_work`), causal tracing's restorations
(:func:`trace_work`), edge attribution's interpolation rows (:func:`eap_work`) and a fine-tune's
steps (:func:`finetune_work`). Each follows the loops of the kernel it counts, so the counted
rows equal the rows the kernel reports (``stats["rows"]`` of the IG kernels).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from capinterp.core.example import Example
from capinterp.core.protocol import Model
from capinterp.core.tokens import encode, encode_prompt
from capinterp.kernels.ig_config import IGConfig
from capinterp.kernels.invariant import N_NODES, scale_invariant, substitute_nodes
from capinterp.kernels.memory import forward_row_bytes, ig_row_bytes
from capinterp.kernels.quadrature import quadrature
from capinterp.localizers.cost_work import Work, weight_bytes

__all__ = [
    "eap_work",
    "finetune_work",
    "forward_work",
    "ig_nodes",
    "ig_work",
    "items_for",
    "sig_work",
    "trace_work",
]


@dataclass(frozen=True)
class _Item:
    """Token ids as a fit will see them (a bare prompt: its greedy target, one token, not yet known)."""

    prompt_ids: list[int]
    target_ids: list[int]

    @property
    def ids(self) -> list[int]:
        return self.prompt_ids + self.target_ids


def items_for(work: Work, examples: Sequence[Example], max_target_tokens: int | None = None) -> list[Any]:
    """Encoded examples (TokenizationError as ``fit`` raises it); a bare prompt counts one greedy
    forward (:func:`capinterp.localizers.dataset.fill_greedy_targets`) and one target token."""
    model = work.model
    items: list[Any] = list(encode(model, examples, max_target_tokens=max_target_tokens, bare="skip"))
    bare = [encode_prompt(model, e.prompt) for e in examples if not e.target]
    if bare:
        forward_work(work, "greedy targets", [len(b) for b in bare], 16)
        items += [_Item(list(b), [0]) for b in bare]
    return items


def _kv_bytes(work: Work, tokens: int) -> float:
    sh = work.shape
    return sh["n_layers"] * tokens * 2 * sh["n_kv"] * sh["d_head"] * work.elem


def ig_nodes(model: Model, config: IGConfig, baseline: bool = False) -> tuple[int, bool]:
    """(gradient nodes per layer, whether one of them is alpha = 1) of one IG kernel call; for the
    adaptive rule its first two rounds (4 + 8 nodes), its count when a layer converges early."""
    if config.adaptive:
        return 4 + 8 + 1, False
    alphas, weights = quadrature(config.steps, config.rule)
    closed = (
        not baseline
        and config.invariance == "auto"
        and len(alphas) >= 2 * N_NODES
        and bool((alphas > 0).all())
        and scale_invariant(model)
    )
    if closed:
        alphas = substitute_nodes(alphas, weights)[0]
    zero = 0 if bool((alphas == 0).any()) else 1
    return len(alphas) + zero, bool((alphas == 1).any())


def ig_work(work: Work, items: Sequence[Any], config: IGConfig, *, baseline: bool = False) -> None:
    """The IG kernel (:func:`capinterp.kernels.ig.ig_scores`) on ``items``: per item a clean run,
    then (layer, node) rows in chunks of ``batch_size``; on the fast route a row scaled at layer
    ``l`` runs blocks ``l..L-1`` on the scaled positions only."""
    model, L = work.model, work.shape["n_layers"]
    nodes, at_one = ig_nodes(model, config, baseline)
    if config.adaptive:
        work.note("adaptive rule: counted as two refinement rounds (more where a layer converges slowly)")
    bs = int(config.batch_size)
    for it in items:
        n_pos = len(it.target_ids) if config.positions == "answer" else 1
        T = len(it.prompt_ids) + n_pos - 1
        if config.route == "loop":
            work.add("clean runs", rows=1, tokens=T, logits=T)
            for c0 in range(0, nodes, bs):
                r = min(bs, nodes - c0)
                work.add("ig rows", rows=r, tokens=T, logits=T, calls=L, grad=True, count_rows=True)
            work.memory(ig_row_bytes(model, T, T) * min(bs, nodes))
            continue
        work.add("clean runs", rows=1, tokens=T, logits=n_pos)
        share = at_one and config.route == "fast"
        rows = [0] if share else []  # the shared clean row runs every block
        rows += [l if config.route == "fast" else 0 for l in range(L) for _ in range(nodes - int(share))]
        _layer_rows(work, "ig rows", rows, bs, tokens=n_pos, context=T, direct=config.route == "fast", logits=n_pos)
        work.memory(ig_row_bytes(model, n_pos, n_pos) * min(bs, len(rows)) + 2 * _kv_bytes(work, T))


def _layer_rows(
    work: Work,
    part: str,
    rows: Sequence[int],
    batch_size: int,
    *,
    tokens: float,
    context: float,
    direct: bool,
    logits: float = 1,
) -> None:
    """Gradient rows, ``batch_size`` per call, each running the blocks from its layer ``rows[i]`` up
    (the IG kernels' batches: a call runs from its lowest row's layer)."""
    L = work.shape["n_layers"]
    for c0 in range(0, len(rows), batch_size):
        chunk = rows[c0 : c0 + batch_size]
        work.add(
            part,
            rows=len(chunk),
            tokens=tokens,
            blocks=sum(L - l for l in chunk) / len(chunk),
            call_blocks=L - min(chunk),
            direct=direct,
            logits=logits,
            context=context,
            grad=True,
            count_rows=True,
        )


def sig_work(work: Work, items: Sequence[Any], config: IGConfig, positions: str) -> None:
    """Sequential IG (:func:`capinterp.kernels.sequential.sig_scores`): per scaled position ``t``
    a clean run, then (layer, node) rows over the tokens ``t..`` of the prompt."""
    model, L = work.model, work.shape["n_layers"]
    alphas = quadrature(config.steps, config.rule)[0]
    nodes = len(alphas) + (0 if bool((alphas == 0).any()) else 1)
    bs = int(config.batch_size)
    bos = getattr(model.tokenizer, "bos_token_id", None)
    for it in items:
        last = len(it.prompt_ids) - 1
        first = 1 if len(it.prompt_ids) > 1 and it.prompt_ids[0] == bos else 0
        for t in [last] if positions == "last_prompt" else range(first, last + 1):
            S = last - t + 1 if config.route == "fast" else last + 1
            work.add("clean runs", rows=1, tokens=last + 1)
            rows = [l if config.route == "fast" else 0 for l in range(L) for _ in range(nodes)]
            _layer_rows(work, "sig rows", rows, bs, tokens=S, context=last + 1, direct=config.route == "fast")
            work.memory(ig_row_bytes(model, S, 1) * min(bs, len(rows)) + 2 * _kv_bytes(work, last + 1))


def forward_work(work: Work, part: str, lengths: Sequence[int], batch_size: int, *, logits: float = 1) -> None:
    """No-grad forward passes over sequences of ``lengths`` tokens, ``batch_size`` per pass (padded)."""
    for c0 in range(0, len(lengths), batch_size):
        chunk = lengths[c0 : c0 + batch_size]
        work.add(part, rows=len(chunk), tokens=max(chunk), logits=logits)
        work.memory(forward_row_bytes(work.model, max(chunk)) * len(chunk))


def trace_work(work: Work, T: int, s0: int, n_kinds: int, samples: int, batch_size: int, cached: bool) -> None:
    """Causal tracing of one fact (:func:`capinterp.kernels.tracing.restoration_probs`): the clean
    run, ``samples`` corrupted copies, then (token >= s0, kind, layer, sample) restoration rows,
    each token's over the corrupted prefix's cache when ``cached``."""
    L = work.shape["n_layers"]
    work.add("clean runs", rows=1, tokens=T)
    work.add("corrupted runs", rows=samples, tokens=T)
    per_t = n_kinds * L * samples
    for t in range(s0, T):
        n = T - t if cached and t > 0 else T
        full, rest = divmod(per_t, batch_size)
        if full:
            work.add("restorations", rows=batch_size, tokens=n, context=T, calls=full, count_rows=True)
        if rest:
            work.add("restorations", rows=rest, tokens=n, context=T, count_rows=True)
    work.memory(forward_row_bytes(work.model, T) * min(batch_size, per_t) + samples * _kv_bytes(work, T))


def eap_work(work: Work, lengths: Sequence[int], steps: int, batch_size: int) -> None:
    """Edge attribution (:func:`capinterp.circuits.eap.score_edges`): per batch of pairs a clean and
    a corrupted run, then ``steps`` interpolated forward + backward rows per pair."""
    for c0 in range(0, len(lengths), batch_size):
        group = lengths[c0 : c0 + batch_size]
        T = max(group)
        work.add("clean + corrupted runs", rows=len(group), tokens=T, logits=T, calls=2)
        n_rows = len(group) * steps
        for r0 in range(0, n_rows, batch_size):
            r = min(batch_size, n_rows - r0)
            work.add("eap rows", rows=r, tokens=T, logits=T, grad=True, count_rows=True)
        work.memory(ig_row_bytes(work.model, T, T) * min(batch_size, n_rows) * 2)


def finetune_work(work: Work, chunks: Sequence[Sequence[Any]], steps: int, optimizer: str) -> None:
    """A full fine-tune (NeFT): ``steps`` forward + backward passes to every weight over the cycled
    chunks, unembedding the answer positions, and one optimizer step over every parameter each."""
    wb = weight_bytes(work.model)
    sh = work.shape
    # fit keeps a copy of every weight (restored at the end), the gradients (and Adam's two
    # moments), and every neuron's weights in float64 before and after (its per-neuron change)
    neurons = 2 * sh["n_layers"] * sh["gated"] * sh["d_model"] * sh["d_mlp"] * 8
    held = wb * (2 if optimizer == "sgd" else 4) + neurons
    for step in range(steps):
        chunk = chunks[step % len(chunks)]
        T = max(len(it.ids) for it in chunk)
        n_ans = sum(len(it.target_ids) for it in chunk)
        work.add("fine-tune steps", rows=len(chunk), tokens=T, logits=n_ans / len(chunk), grad="params")
        # zero_grad(set_to_none) then backward writes the gradients; the step reads weights + grads
        work.traffic("optimizer steps", wb * (4 if optimizer == "sgd" else 8))
        work.memory(ig_row_bytes(work.model, T, n_ans) * len(chunk) + held)
    work.traffic("weights saved and restored", wb * 4)
