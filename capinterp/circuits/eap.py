"""Edge attribution patching (EAP) and its integrated-gradients form (EAP-IG).

For a clean/corrupted pair and a loss 𝓛 (the metric as a loss; lower = more like the clean answer)::

    s(u -> v) = sum_{pos} (a_u^corrupt - a_u^clean) . (1/K) sum_{k=1..K} d𝓛/d input_v |_{x_k}

with ``x_k`` the run whose input embeddings are ``e_corrupt + (k/K) (e_clean - e_corrupt)`` (right
Riemann rule; K = 1 is plain EAP, the gradient at the clean run). ``input_v`` is the residual stream
read by slot v *before* its layer norm, per head for q and per KV group for k/v, so a score is the
first-order change of 𝓛 when the edge alone carries the corrupted value (positive: the edge
matters for the clean answer). All edges come from one product per pair:
``scores[u, v] = einsum("tud,tvd->uv", dA, G)``. Scores are averaged over pairs.

Losses (``metric``): ``"logit_diff"`` = -(logit[clean label] - logit[corrupted label]) at the last
prompt position; ``"nll"`` = mean -log p(target token) over the teacher-forced target tokens;
``"auto"`` (default) = logit_diff where the pair has a corrupted label different from the clean
one, nll otherwise.

Corruption (:func:`make_pairs`):

* ``"auto"``: replace ``meta["subject"]`` in the prompt by another fact's subject whose prompt then
  has the same number of tokens (positions must line up); the corrupted label is that fact's first
  target token. Candidates (subjects of the same token width) are tried in a seeded order, at most
  20, preferring a different label. When a fact has no subject, its subject is not in the prompt,
  or no candidate fits, it falls back to noise.
* ``"noise"``: Gaussian noise on the input embeddings at the subject's tokens (all prompt tokens
  but BOS when there is no subject), std = ``noise`` x the std of those embeddings over the dataset
  (ROME's 3 sigma); fixed seed per fact.
* a callable ``f(example) -> Example | (prompt, target) | prompt``: the corrupted prompt (same
  token count) and optionally its label.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from capinterp.arch.forward import capture
from capinterp.circuits.forward import graph_mode, run_graph
from capinterp.circuits.graph import Graph
from capinterp.core import distributed as dist
from capinterp.core.example import Example, as_examples
from capinterp.core.protocol import Model
from capinterp.core.tokens import Encoded, TokenizationError, batches, encode, pad_id, pad_right
from capinterp.kernels.quadrature import check_rule, quadrature

__all__ = ["LOSSES", "Pair", "corrupt_embeddings", "make_pairs", "noise_std", "score_edges"]

#: EAP losses (the ``metric=`` argument): ``"auto"`` picks ``"logit_diff"`` when a corrupted answer exists.
LOSSES = ("auto", "logit_diff", "nll")
_MAX_TRIES = 20  # subject-swap candidates (of matching subject width) tried per fact


@dataclass
class Pair:
    """A clean item and its corrupted twin (same length, so positions line up)."""

    clean: Encoded
    corrupt_ids: list[int]  # prompt+target ids of the corrupted run (== clean ids for noise)
    corrupt_label: int | None = None  # first token of the corrupted answer, if any
    noise_positions: list[int] = field(default_factory=list)
    mode: str = "swap"  # "swap" | "noise" | "custom"


def _subject_positions(tok: Any, enc: Encoded, subject: str | None) -> list[int]:
    prompt = enc.example.prompt
    offs = tok(prompt, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    n_bos = len(enc.prompt_ids) - len(offs)
    start = prompt.find(subject) if subject else -1
    if not subject or start < 0:
        return list(range(n_bos, len(enc.prompt_ids)))
    end = start + len(subject)
    pos = [n_bos + i for i, (a, b) in enumerate(offs) if a < end and b > start]
    return pos or list(range(n_bos, len(enc.prompt_ids)))


def make_pairs(model: Model, facts: Any, corrupt: str | Callable = "auto", *, seed: int = 0) -> list[Pair]:
    """Clean/corrupted pairs for every fact (see the module docstring for the rules)."""
    if not (callable(corrupt) or corrupt in ("auto", "noise")):
        raise ValueError(f"corrupt must be 'auto', 'noise' or a callable, got {corrupt!r}")
    examples = as_examples(facts)
    items = encode(model, examples)
    tok = model.tokenizer
    rng = random.Random(seed)
    subjects: list[str] = [it.example.meta.get("subject") or "" for it in items]  # "" when a fact has none
    n_tok: dict[tuple[str, bool], int] = {}

    def width(subj: str, lead: bool) -> int:  # tokens of the subject as it sits in a prompt
        if (subj, lead) not in n_tok:
            n_tok[subj, lead] = len(tok((" " if lead else "") + subj, add_special_tokens=False)["input_ids"])
        return n_tok[subj, lead]

    pairs: list[Pair] = []
    for i, enc in enumerate(items):
        ex, subject = enc.example, subjects[i]
        if callable(corrupt):
            pairs.append(_custom(model, enc, corrupt(ex), i))
            continue
        found = None
        if corrupt == "auto" and subject and subject in ex.prompt:
            start = ex.prompt.index(subject)
            lead = ex.prompt[start - 1 : start] == " "
            order = rng.sample(range(len(items)), len(items))
            others = [
                k
                for k in order
                if subjects[k] and subjects[k] != subject and width(subjects[k], lead) == width(subject, lead)
            ]
            for k in others[:_MAX_TRIES]:
                cp = ex.prompt.replace(subject, subjects[k], 1)
                try:
                    c = encode(model, [Example(cp, items[k].example.target, items[k].example.meta)])[0]
                except TokenizationError:
                    continue
                if len(c.prompt_ids) != len(enc.prompt_ids):
                    continue
                label = c.target_ids[0]
                cand = Pair(enc, c.prompt_ids + enc.target_ids, None if label == enc.target_ids[0] else label)
                found = found or cand
                if cand.corrupt_label is not None:
                    found = cand
                    break
        if found is None:
            found = Pair(enc, list(enc.ids), None, _subject_positions(tok, enc, subject), "noise")
        pairs.append(found)
    return pairs


def _custom(model: Model, enc: Encoded, out: Any, i: int) -> Pair:
    if isinstance(out, Example):
        prompt, target = out.prompt, out.target
    elif isinstance(out, str):
        prompt, target = out, ""
    else:
        prompt, target = out
    c = encode(
        model, [Example(prompt, target, {}) if target else Example(prompt, enc.example.target, enc.example.meta)]
    )[0]
    if len(c.prompt_ids) != len(enc.prompt_ids):
        raise TokenizationError(
            f"fact {i}: the corrupted prompt {prompt!r} has {len(c.prompt_ids)} tokens, the clean one "
            f"{len(enc.prompt_ids)}; clean and corrupted prompts must have the same token count"
        )
    label = c.target_ids[0] if target else None
    return Pair(enc, c.prompt_ids + enc.target_ids, None if label == enc.target_ids[0] else label, [], "custom")


def _tensor(rows: Sequence[list[int]], pad: int, device: Any) -> torch.Tensor:
    return pad_right(rows, pad)[0].to(device)


def pair_loss(logits: torch.Tensor, pairs: Sequence[Pair], metric: str) -> torch.Tensor:
    """``[B]`` per-row loss (see the module docstring)."""
    logp = None
    out = []
    for b, p in enumerate(pairs):
        enc = p.clean
        if metric == "logit_diff" or (metric == "auto" and p.corrupt_label is not None):
            if p.corrupt_label is None:
                raise ValueError("metric='logit_diff' needs a corrupted label for every pair (subject swaps)")
            row = logits[b, enc.last_prompt_pos].float()
            out.append(row[p.corrupt_label] - row[enc.target_ids[0]])
        else:
            if logp is None:
                logp = torch.log_softmax(logits.float(), dim=-1)
            pos = torch.tensor(enc.answer_positions, device=logits.device)
            out.append(-logp[b, pos, torch.tensor(enc.target_ids, device=logits.device)].mean())
    return torch.stack(out)


def input_embeddings(model: Model, tokens: torch.Tensor) -> torch.Tensor:
    """The ``input`` node's output (the residual entering block 0), without running the blocks."""
    return capture(model, tokens, "blocks.0.hook_resid_pre").detach().clone()


def corrupt_embeddings(
    model: Model, pairs: Sequence[Pair], index: Sequence[int], tokens: torch.Tensor, sigma: float, seed: int = 0
) -> torch.Tensor:
    """Input embeddings of the corrupted rows ``tokens``, with each noise pair's fixed-seed noise added.

    ``index[b]`` is row b's position in the whole dataset (it seeds the noise, so batching never
    changes a fact's corruption).
    """
    e = input_embeddings(model, tokens)
    for b, (i, p) in enumerate(zip(index, pairs)):
        if p.noise_positions:
            gen = torch.Generator().manual_seed(seed * 1_000_003 + i)
            z = torch.randn(len(p.noise_positions), e.shape[-1], generator=gen)
            e[b, p.noise_positions] += (sigma * z).to(e)
    return e


def noise_std(model: Model, graph: Graph, pairs: Sequence[Pair], noise: float, batch_size: int = 8) -> float:
    """``noise`` x std of the clean input embeddings at the noised positions (over the dataset)."""
    vals = []
    dev = next(model.parameters()).device
    with torch.no_grad():
        for chunk in batches([p for p in pairs if p.noise_positions], batch_size):
            toks = _tensor([p.clean.ids for p in chunk], pad_id(model.tokenizer), dev)
            e = input_embeddings(model, toks)
            vals += [e[b, p.noise_positions].flatten().float() for b, p in enumerate(chunk)]
    return float(noise * torch.cat(vals).std()) if vals else 0.0


def score_edges(
    model: Model,
    graph: Graph,
    pairs: Sequence[Pair],
    *,
    steps: int = 30,
    metric: str = "auto",
    noise: float = 3.0,
    seed: int = 0,
    batch_size: int = 8,
    rule: str = "right",
    progress: bool = False,
) -> tuple[torch.Tensor, dict]:
    """EAP (``steps=1``, right rule) or EAP-IG scores, float32 ``[n_src, n_slots]`` (0 off the edges), and run info.

    ``rule``/``steps``: the quadrature of the path integral from the corrupted to the clean input
    (:mod:`capinterp.kernels.quadrature`; Hanna et al. 2024 use the right Riemann sum).
    """
    check_rule(steps, rule)
    if metric not in LOSSES:
        raise ValueError(f"metric must be one of {LOSSES}, got {metric!r}")
    if not pairs:
        raise ValueError("score_edges needs at least one pair")
    dev = next(model.parameters()).device
    pad = pad_id(model.tokenizer)
    sigma = noise_std(model, graph, pairs, noise, batch_size)
    scores = torch.zeros(graph.n_src, graph.n_slots, dtype=torch.float64)  # float64 on the CPU (MPS has none)
    losses: list[tuple[int, float, float]] = []  # (pair, clean loss, corrupted loss)
    nodes, weights = quadrature(steps, rule)
    alphas = list(zip(nodes.tolist(), weights.tolist()))
    dist.init(dev)  # under torchrun: each rank scores every world_size-th batch of pairs
    mine = dist.shard(list(batches(list(range(len(pairs))), batch_size)))
    bar = _progress(sum(map(len, mine)), progress and dist.is_main())
    with graph_mode(model, graph):
        for group in mine:
            gp = [pairs[i] for i in group]
            clean = _tensor([p.clean.ids for p in gp], pad, dev)
            corrupt = _tensor([p.corrupt_ids for p in gp], pad, dev)
            with torch.no_grad():
                rc = run_graph(model, graph, clean)
                e_corr = corrupt_embeddings(model, gp, group, corrupt, sigma, seed)
                rk = run_graph(model, graph, corrupt, resid0=e_corr)
                d_out = (rk.outputs - rc.outputs).float()
                losses += zip(
                    group, pair_loss(rc.logits, gp, metric).tolist(), pair_loss(rk.logits, gp, metric).tolist()
                )
            e_clean = rc.outputs[:, :, 0]
            grads = torch.zeros(*d_out.shape[:2], graph.n_slots, d_out.shape[-1], device=dev)
            rows = [(b, a, w) for b in range(len(gp)) for a, w in alphas]
            for chunk in batches(rows, batch_size):
                idx = torch.tensor([b for b, _, _ in chunk], device=dev)
                alpha = torch.tensor([a for _, a, _ in chunk], device=dev, dtype=e_clean.dtype)[:, None, None]
                weight = torch.tensor([w for _, _, w in chunk], device=dev, dtype=torch.float32)
                x = (e_corr[idx] + alpha * (e_clean[idx] - e_corr[idx])).detach().requires_grad_(True)
                with torch.enable_grad():
                    run = run_graph(model, graph, clean[idx], resid0=x, keep_slots=True)
                    loss = pair_loss(run.logits, [gp[b] for b, _, _ in chunk], metric)
                    loss = (loss * weight.to(loss.dtype)).sum()  # rows are independent: w_k scales row k's gradient
                    g = torch.autograd.grad(loss, run.slot_inputs, allow_unused=True)
                filled = [torch.zeros_like(t) if gi is None else gi for gi, t in zip(g, run.slot_inputs)]
                grads.index_add_(0, idx, run.stack_slots(filled).float())
            scores += torch.einsum("btud,btvd->uv", d_out, grads).double().cpu()
            bar.update(len(group))
    bar.close()
    scores = (dist.all_reduce_sum(scores, dev) / len(pairs)).float() * graph.edge_mask
    merged = dist.gather_indexed([(i, (c, k)) for i, c, k in losses])
    clean_loss, corrupt_loss = [c for c, _ in merged], [k for _, k in merged]
    modes = [p.mode for p in pairs]
    info = {
        "steps": steps,
        "rule": rule,
        "metric": metric,
        "noise_std": sigma,
        "n_pairs": len(pairs),
        "corruption": {m: modes.count(m) for m in sorted(set(modes))},
        "clean_loss": clean_loss,
        "corrupt_loss": corrupt_loss,
    }
    return scores, info


class _NoBar:
    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


def _progress(total: int, on: bool) -> Any:
    if not on:
        return _NoBar()
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="edge attribution", unit="fact")
