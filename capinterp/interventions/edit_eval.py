"""Measurements for knowledge edits: next-token probabilities, perplexity, and edit metrics.

Both run under whatever hooks or weight edits the model carries, so measuring inside
``with edit.apply(model):`` measures the edited model. Prompts follow the model's BOS
convention (:func:`capinterp.core.tokens.model_bos`) and are right-padded in batches.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from capinterp.arch.forward import logits_at
from capinterp.core.example import Example
from capinterp.core.protocol import Model
from capinterp.core.tokens import batches, model_bos, pad_id, pad_right

__all__ = ["EditBaseline", "measure_edit", "next_token_probs", "perplexity", "probe_ids", "prompt_ids"]


@dataclass(frozen=True)
class EditBaseline:
    """The unedited model's measurements, where already taken (:func:`~capinterp.interventions.editing.edit_table`
    takes them once per fact): ``ppl`` its perplexity on the neutral text, ``probs`` its next-token
    probabilities ``[n_queries + n_unrelated, d_vocab]`` (the queries, then the unrelated prompts)."""

    ppl: float | None = None
    probs: Tensor | None = None


def prompt_ids(model: Model, prompt: str) -> list[int]:
    """Token ids of ``prompt`` as the model reads it (BOS per its tokenizer's convention)."""
    return model_bos(model) + list(model.tokenizer(prompt, add_special_tokens=False)["input_ids"])


def probe_ids(model: Model, enc, others: Sequence[Example]) -> list[list[int]]:
    """The prompts an edit is measured on: the fact's encoded queries, then the unrelated prompts."""
    return [list(e.prompt_ids) for e in enc] + [prompt_ids(model, o.prompt) for o in others]


@torch.no_grad()
def next_token_probs(model: Model, ids: Sequence[Sequence[int]], batch_size: int = 16) -> Float[Tensor, "n d_vocab"]:
    """Softmax of the next-token logits after each id sequence: ``[n, d_vocab]`` float32 on the CPU."""
    if not ids:
        return torch.zeros(0, int(model.cfg.d_vocab))
    dev, pid, out = model.cfg.device, pad_id(model.tokenizer), []
    for chunk in batches(list(ids), batch_size):
        tokens, lengths = pad_right(chunk, pid)
        out.append(logits_at(model, tokens.to(dev), lengths.to(dev) - 1).softmax(-1).cpu())
    return torch.cat(out)


@torch.no_grad()
def perplexity(model: Model, texts: str | Sequence[str], max_tokens: int = 64, batch_size: int = 8) -> float:
    """exp(mean token NLL) over all predicted tokens of ``texts`` (each cut to ``max_tokens``).

    Each token is predicted from the tokens before it; the first token of a sequence (the BOS,
    where the model uses one) is context only. Texts run right-padded in batches; padding is
    never scored. NaN when no text has two tokens.
    """
    if isinstance(texts, str):
        texts = [texts]
    if max_tokens < 2:
        raise ValueError(f"max_tokens must be >= 2, got {max_tokens}")
    seqs = [ids for ids in (prompt_ids(model, t)[:max_tokens] for t in texts) if len(ids) >= 2]
    total, count, dev = 0.0, 0, model.cfg.device
    for chunk in batches(seqs, batch_size):
        tokens, lengths = pad_right(chunk, pad_id(model.tokenizer))
        tokens = tokens.to(dev)
        logp = model(tokens).float().log_softmax(-1)[:, :-1]
        nll = -logp.gather(-1, tokens[:, 1:, None]).squeeze(-1)
        scored = torch.arange(nll.shape[1], device=dev)[None] < (lengths.to(dev) - 1)[:, None]
        total += float(nll[scored].sum())
        count += int(scored.sum())
    return math.exp(total / count) if count else float("nan")


def measure_edit(
    model: Model,
    edit: Any,
    enc,
    new_ids,
    others: list[Example],
    texts: list[str],
    batch_size: int,
    baseline: EditBaseline = EditBaseline(),
) -> None:
    """Fill ``edit.metrics`` and ``edit.records`` of a :class:`~capinterp.interventions.editing.KnowledgeEdit`.

    ``enc``: the fact's encoded queries (first answer token each); ``new_ids``: the new answer's
    first token per query (update) or None (erase); ``others``: unrelated prompts; ``texts``:
    neutral text for perplexity; ``baseline``: the unedited measurements already taken.
    Measures before (what ``baseline`` lacks), then inside ``edit.apply(model)``.
    """
    ids = probe_ids(model, enc, others)
    before, ppl_before = baseline.probs, baseline.ppl
    if before is None:
        before = next_token_probs(model, ids, batch_size)
    elif tuple(before.shape) != (len(ids), int(model.cfg.d_vocab)):
        raise ValueError(f"baseline.probs must be [{len(ids)}, {int(model.cfg.d_vocab)}], got {tuple(before.shape)}")
    if ppl_before is None and texts:
        ppl_before = perplexity(model, texts)
    with edit.apply(model):
        after = next_token_probs(model, ids, batch_size)
        ppl_after = perplexity(model, texts) if texts else float("nan")
    q = edit.params["query_index"]
    rows = []
    for r in range(len(ids)):
        is_fact = r < len(enc)
        old_id = enc[r].target_ids[0] if is_fact else None
        row = {
            "role": ("edited" if r == q else "paraphrase") if is_fact else "unrelated",
            "prompt": (enc[r].example if is_fact else others[r - len(enc)]).prompt,
            "top_before": int(before[r].argmax()),
            "top_after": int(after[r].argmax()),
        }
        if is_fact:
            row.update(p_old_before=float(before[r, old_id]), p_old_after=float(after[r, old_id]))
            if new_ids is not None:
                new_id = new_ids[r]
                row.update(p_new_before=float(before[r, new_id]), p_new_after=float(after[r, new_id]))
                row["success"] = row["top_after"] == new_id
            else:
                row["success"] = row["top_after"] != old_id
        else:
            row["success"] = row["top_after"] == row["top_before"]
        rows.append(row)
    df = pd.DataFrame(rows)
    edit.records = df

    def mean(role: str, col: str) -> float:
        x = df.loc[df["role"] == role, col]
        return float(x.astype(float).mean()) if len(x) else float("nan")

    fact_df = df[df["role"] != "unrelated"]
    if edit.mode == "erase":
        drop = (fact_df["p_old_before"] - fact_df["p_old_after"]) / fact_df["p_old_before"].clip(lower=1e-12)
        prob = drop
    else:
        prob = fact_df["p_new_after"]
    is_edited = fact_df["role"] == "edited"
    m = {
        "reliability": mean("edited", "success"),
        "generalization": mean("paraphrase", "success"),
        "locality": mean("unrelated", "success"),
    }
    m["avg"] = float(np.nanmean(list(m.values()))) if any(np.isfinite(list(m.values()))) else float("nan")
    m.update(
        rel_prob=float(prob[is_edited].mean()),
        gen_prob=float(prob[~is_edited].mean()) if (~is_edited).any() else float("nan"),
        ppl_before=float(ppl_before) if ppl_before is not None else float("nan"),
        ppl_after=float(ppl_after),
        n_neurons=float(len(edit.neurons)),
    )
    m["delta_ppl"] = m["ppl_after"] - m["ppl_before"]
    edit.metrics = m
