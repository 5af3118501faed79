"""Head cards: what an attention head ``(layer, head)`` does.

Per head, :func:`head_cards` gathers:

* **top contexts**: the destination tokens where the head writes most, ranked by the norm of its
  output ``||z_h @ W_O[h]^T||`` (:mod:`capinterp.cards.head_acts`), one streamed pass for all heads;
  the snippet's values are that norm at each token;
* **attention**: for each top context, the head's attention pattern row at the destination (its
  weights over the source tokens, from ``hook_pattern``), kept in ``card.details["attention"]``: the
  last ``2 * window + 1`` sources up to the destination with their weights, the weight outside that
  strip, and the most-attended sources anywhere;
* **top source tokens**: the source token ids with the largest attention weight summed over the top
  contexts' rows, divided by the number of contexts (``card.details["sources"]``);
* **OV circuit** (``card.effect``): the tokens the head's OV circuit promotes and suppresses for its
  top :data:`SOURCES` source tokens that are not special tokens (BOS and the like, often an attention
  sink), their mean (:func:`capinterp.cards.logit_effect.head_ov_effects`, whose ``definition`` says
  what was multiplied); with no such source, the head's strongest source token; None where the OV
  circuit is not linear (normalized values), with the reason in ``card.details["ov"]``;
* **on the task**: the output norm's statistics on the task's prompts and the specificity against the
  corpus (no chance level), and, for the first :data:`ABLATE` heads when every task example has a
  target, the effect of zeroing the head's ``z_h`` (its whole output) on the task
  (:func:`head_ablation_effects`; :func:`capinterp.kernels.evaluate`).

Input: a KeySet of kind ``"head"`` (keys ``(layer, head)``) or a ``[n_layers, n_heads]`` array of
head scores (what :func:`capinterp.circuits.head_patching.head_effects` and ``head_atp`` return;
NaN entries, e.g. a hybrid model's layers without attention, are left out), via :func:`head_keys`.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np
import torch

from capinterp.arch.family import UnsupportedFamily
from capinterp.cards._act_stream import encode_texts
from capinterp.cards.card import UnitCard, specificity
from capinterp.cards.head_acts import attention_rows, check_heads, head_norm_contexts, z_hook
from capinterp.core.example import Example
from capinterp.core.protocol import Model

__all__ = ["ABLATE", "SOURCES", "head_ablation_effects", "head_cards", "head_details_html", "head_keys"]

#: Top source tokens (not special) whose mean OV output is a head card's logit effect.
SOURCES = 5
#: Heads (the top-ranked) ablated one at a time on the task.
ABLATE = 10
_WINDOW = 8  # snippet tokens each side; the attention strip shows 2 * _WINDOW + 1 sources


def head_keys(
    model: Model, units: Any, top: int, *, source: str | None = None
) -> tuple[list[tuple[int, int]], dict[Any, float] | None, int, str]:
    """``(keys in rank order cut to top, scores or None, heads in the input, source)`` of a head KeySet or a
    ``[n_layers, n_heads]`` score array (module docstring), the fields of a head
    :class:`~capinterp.cards.inputs.Plan`: ValueError when it is empty, has the wrong shape or names a head
    the model lacks."""
    from capinterp.units.base import KeySet

    if isinstance(units, KeySet):
        keys = check_heads(model, sorted(units.keys())) if units.keys() else []
        if not keys:
            raise ValueError("the head KeySet is empty: nothing to describe")
        return keys[:top], None, len(keys), source or "head KeySet"
    arr = np.asarray(units.detach().cpu() if isinstance(units, torch.Tensor) else units, dtype=np.float64)
    want = (int(model.cfg.n_layers), int(model.cfg.n_heads))
    if arr.shape != want:
        raise ValueError(f"head scores must have shape {want} (n_layers, n_heads), got {arr.shape}")
    scores = {(int(l), int(h)): float(arr[l, h]) for l, h in zip(*np.nonzero(np.isfinite(arr)))}
    if not scores:
        raise ValueError("the head scores are all NaN: nothing to describe")
    check_heads(model, list(scores))
    keys = sorted(scores, key=lambda u: (-scores[u], u))[:top]
    return keys, scores, len(scores), source or "head scores [n_layers, n_heads]"


def head_cards(
    model: Model,
    plan: Any,
    corpus: list[str],
    examples: list[Example] | None,
    *,
    k: int,
    progress: bool,
    ablate: int = ABLATE,
    **run: Any,
) -> list[UnitCard]:
    """One card per head of ``plan`` (the builder :func:`capinterp.cards.describe` calls for heads)."""
    from capinterp.cards.logit_effect import head_ov_effects

    heads = check_heads(model, plan.keys)
    found = head_norm_contexts(model, heads, corpus, k=k, window=_WINDOW, progress=progress, **run)
    task = None
    if examples:
        prompts = [e.prompt for e in examples]
        task = head_norm_contexts(model, heads, prompts, k=1, window=0, progress=False, **run)
    ids = encode_texts(model, corpus, run.get("max_tokens"))
    wanted = [(u, c.text_index, c.position) for u, acts in zip(heads, found) for c in acts.contexts]
    rows = attention_rows(model, ids, wanted, run.get("batch_size", 8))
    decode = functools.lru_cache(maxsize=None)(lambda t: model.tokenizer.decode([t]))
    special = set(getattr(model.tokenizer, "all_special_ids", []) or [])
    details: list[dict[str, Any]] = []
    chosen: dict[tuple[int, int], list[int]] = {}
    for u, acts in zip(heads, found):
        row = {c: rows[(u, c.text_index, c.position)] for c in acts.contexts}
        strips = [_strip(ids[c.text_index], row[c], c.position, decode) for c in acts.contexts]
        srcs = _sources(ids, [(c.text_index, row[c]) for c in acts.contexts], decode, special)
        details.append({"attention": strips, "sources": srcs})
        picked = [s["id"] for s in srcs if not s["special"]][:SOURCES]
        if picked:
            chosen[u] = picked
    try:
        effects: list[Any] = head_ov_effects(model, heads, k=k, sources=chosen)
    except UnsupportedFamily as err:  # e.g. normalized values (Gemma 4's v_norm): no linear OV circuit
        effects = [None] * len(heads)
        for d in details:
            d["ov"] = str(err)
    ablation = head_ablation_effects(model, heads[:ablate], examples, run.get("batch_size", 8))
    cards = []
    for i, (u, acts) in enumerate(zip(heads, found)):
        ts = task[i].stats if task is not None else None
        card = UnitCard(u, "head", list(acts.contexts), acts.stats, ts, specificity(ts, acts.stats), None, effects[i])
        card.score = plan.scores.get(u) if plan.scores is not None else None
        card.ablation = ablation[i] if i < len(ablation) else None
        card.details = details[i]
        cards.append(card)
    return cards


def _strip(ids: list[int], row: list[float], pos: int, decode: Any) -> dict[str, Any]:
    """One context's attention row: the strip of sources ending at the destination, and the top sources."""
    start = max(0, pos - 2 * _WINDOW)
    order = sorted(range(len(row)), key=lambda j: (-row[j], j))[:3]
    return {
        "position": pos,
        "start": start,
        "tokens": [str(decode(t)) for t in ids[start : pos + 1]],
        "weights": [float(w) for w in row[start:]],
        "outside": float(sum(row[:start])),
        "top": [{"position": j, "token": str(decode(ids[j])), "weight": float(row[j])} for j in order],
    }


def _sources(ids: list[list[int]], rows: list[tuple[int, list[float]]], decode: Any, special: set[int]) -> list[dict]:
    """The source tokens by attention weight summed over the rows, per row (mean), top 10."""
    total: dict[int, float] = {}
    for text, row in rows:
        for tok, w in zip(ids[text], row):
            total[tok] = total.get(tok, 0.0) + float(w)
    n = max(len(rows), 1)
    best = sorted(total, key=lambda t: (-total[t], t))[:10]
    return [{"token": str(decode(t)), "id": int(t), "weight": total[t] / n, "special": t in special} for t in best]


def head_ablation_effects(
    model: Model, heads: list[tuple[int, int]], examples: list[Example] | None, batch_size: int = 8
) -> list[dict[str, float]]:
    """Per head, the task's mean target probability and accuracy with only that head's output zeroed (its
    ``z_h`` set to 0 at every position), and their change from the unablated model; ``[]`` without a
    task or when an example has no target."""
    from capinterp.cards.ablation import ablate_each

    if not heads or not examples or any(not e.target for e in examples):
        return []
    n_heads = int(model.cfg.n_heads)

    def zeroed(l: int, h: int) -> Any:
        def zero(z: torch.Tensor, hook: Any) -> torch.Tensor:
            z = z.clone()
            if z.ndim == 4:
                z[:, :, h] = 0
            else:
                d = z.shape[-1] // n_heads
                z[..., h * d : (h + 1) * d] = 0
            return z

        return lambda: model.hooks(fwd_hooks=[(z_hook(l), zero)])

    return ablate_each(model, examples, [zeroed(l, h) for l, h in heads], batch_size)


def head_details_html(card: Any) -> str:
    """A head card's own sections: each top context's attention strip, the top source tokens."""
    from types import SimpleNamespace

    from capinterp.cards.page import _e, _num, _token_list, snippet

    parts = ['<div class="label">attention at each top context (weight on each source; destination outlined)</div>']
    for a in card.details.get("attention", []):
        ctx = SimpleNamespace(
            tokens=a["tokens"], values=a["weights"], focus=len(a["tokens"]) - 1, activation=max(a["weights"])
        )
        scale = max(a["weights"]) if a["weights"] else 0.0
        top = ", ".join(f"{t['token']!r}@{t['position']} {_num(t['weight'], '.2f')}" for t in a["top"])
        note = f"earlier sources {_num(a['outside'], '.2f')}; top: {top}" if a["outside"] > 0 else f"top: {top}"
        strip = snippet(ctx, scale if math.isfinite(scale) else 0.0)
        parts.append(f'<div class="attn">{strip}<div class="meta">{_e(note)}</div></div>')
    if card.details.get("ov"):
        parts.append(f'<div class="meta">no OV effect: {_e(card.details["ov"])}</div>')
    srcs = card.details.get("sources", [])
    if srcs:
        rows = [(s["token"], s["id"], s["weight"]) for s in srcs]
        parts.append(_token_list("top source tokens (mean attention weight over the top contexts)", rows, "src"))
    return "".join(parts)
