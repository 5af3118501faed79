"""Circuit-only recall: Hit@k of the target when every edge outside a circuit is ablated
(Yao et al. 2024, Sec. 3; Huang et al. 2025, Sec. 3.2 reports Hit@1 of the located circuit)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from capinterp.circuits.eap import _tensor, corrupt_embeddings, make_pairs, noise_std
from capinterp.circuits.forward import graph_mode, mean_outputs, run_graph
from capinterp.circuits.graph import Circuit
from capinterp.core.example import as_examples
from capinterp.core.position_mean import batch_rows
from capinterp.core.protocol import Model
from capinterp.core.settings import set_threads
from capinterp.core.tokens import EncodedBatch, batches, collate, encode, pad_id

__all__ = ["ABLATIONS", "hit_at_k"]


def _ranks(logits: torch.Tensor, batch: EncodedBatch) -> torch.Tensor:
    """Pessimistic rank (0 = top) of each row's first target token at its last prompt position."""
    ranks = []
    for b, it in enumerate(batch.items):
        row = logits[b, it.last_prompt_pos].float()
        ranks.append(int((row >= row[it.target_ids[0]]).sum()) - 1)
    return torch.tensor(ranks)


ABLATIONS = ("zero", "mean", "corrupt")


@torch.no_grad()
def hit_at_k(
    model: Model,
    circuit: Circuit,
    facts: Any,
    k: int | Sequence[int] = (1, 10),
    *,
    ablation: str = "zero",
    corrupt: Any = "auto",
    noise: float = 3.0,
    seed: int = 0,
    batch_size: int = 16,
    full: bool = False,
    threads: int | None = None,
    across_models: bool = False,
) -> dict[str, float]:
    """Circuit-only Hit@k: the share of facts whose first target token ranks in the top k.

    Every edge outside ``circuit`` is ablated: ``"zero"`` (KC / CNL's convention), ``"mean"`` (the
    source's mean output over the facts' tokens, first positions apart) or ``"corrupt"`` (its output on the corrupted prompt,
    made as for EAP with ``corrupt`` / ``noise`` / ``seed``: the EAP-IG library's convention).
    Returns ``{"hit@1": ..., "hit@10": ..., "n": N}``; ``full=True`` adds the unablated model's
    ``"full_hit@k"``.

    The circuit is checked against the model first (:meth:`Circuit.check_model`: its graph, and its
    model fingerprint; ``across_models=True`` accepts another checkpoint of the architecture).
    """
    if not isinstance(circuit, Circuit):
        raise TypeError(f"circuit must be a Circuit, got {type(circuit).__name__}")
    circuit.check_model(model, across_models=across_models)
    if ablation not in ABLATIONS:
        raise ValueError(f"ablation must be one of {ABLATIONS}, got {ablation!r}")
    set_threads(threads)
    ks = [int(k)] if isinstance(k, int) else [int(x) for x in k]
    graph = circuit.graph
    pairs = make_pairs(model, facts, corrupt, seed=seed) if ablation == "corrupt" else None
    items = [p.clean for p in pairs] if pairs else encode(model, as_examples(facts), max_target_tokens=1)
    if not items:
        raise ValueError("hit_at_k needs at least one fact")
    removed = graph.edge_mask & ~circuit.mask
    ranks, full_ranks = [], []
    dev = next(model.parameters()).device
    pad = pad_id(model.tokenizer)
    chunks = list(batches(list(range(len(items))), batch_size))
    with graph_mode(model, graph):
        mean = None
        if ablation == "mean":
            batched = (collate([items[i] for i in c], pad, with_target=False, device=dev) for c in chunks)
            mean = mean_outputs(model, graph, ((b.tokens, b.lengths) for b in batched))
        sigma = noise_std(model, graph, pairs, noise, batch_size) if pairs else 0.0
        for chunk in chunks:
            batch = collate([items[i] for i in chunk], pad, with_target=False, device=dev)
            B, T = batch.tokens.shape
            ref = None if mean is None else batch_rows(mean, B, T)
            if pairs:
                gp = [pairs[i] for i in chunk]
                toks = _tensor([p.corrupt_ids[: len(p.clean.prompt_ids)] for p in gp], pad, dev)
                e = corrupt_embeddings(model, gp, chunk, toks, sigma, seed)
                ref = run_graph(model, graph, toks, resid0=e, logits=False).outputs
            ranks.append(_ranks(run_graph(model, graph, batch.tokens, removed=removed, ref=ref).logits, batch))
            if full:
                full_ranks.append(_ranks(model(batch.tokens), batch))
    r = torch.cat(ranks)
    out: dict[str, float] = {f"hit@{x}": float((r < x).float().mean()) for x in ks}
    if full:
        fr = torch.cat(full_ranks)
        out.update({f"full_hit@{x}": float((fr < x).float().mean()) for x in ks})
    out["n"] = len(items)
    return out
