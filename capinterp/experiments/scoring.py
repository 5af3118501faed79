"""How well a (possibly intervened) model does on one capability's examples, in one number.

Two metrics, each named in every experiment table's ``metric`` column:

- ``"accuracy"``: greedy accuracy from :func:`capinterp.evaluate.evaluate` (answers parsed per
  format; for plain-text targets, the stripped continuation must start with the stripped target).
  Meaningful for arithmetic (one number) and sentiment (one label word).
- ``"target_prob"``: the mean over the target's *content* tokens of ``p(y_j | x + y_<j)``,
  teacher-forced, averaged over examples -- CNL's objective F (ALGORITHMS.md 4.1) without the
  whitespace-only tokens (a lone space, a line break, indentation), which any model predicts
  and which would otherwise dominate short answers. One forward per batch, so it is
  cheap also for long targets (the first line of code, ~10 tokens, where greedy decoding needs
  a forward per token and exact-match accuracy of a 270M model is near zero). It is also the
  right number where the target's first token carries no answer (Gemma splits ``" 45"`` into
  ``" "``, ``"4"``, ``"5"``, so ``EvalResult.mean_prob`` would be ``p(" ")``).

:func:`measure` gives both views of one run where asked: the primary metric and the mean target
probability, so every table can show a probability next to an accuracy.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch

from capinterp.data.example import Example
from capinterp.evaluate import evaluate
from capinterp.forward import capture, unembed
from capinterp.tokens import batches, collate, encode, pad_id

METRICS: tuple[str, ...] = ("accuracy", "target_prob")


@torch.no_grad()
def target_scores(model: Any, examples: Sequence[Example], batch_size: int = 16) -> dict[str, np.ndarray]:
    """Per-example teacher-forced target statistics (hooks on the model apply).

    Returns ``{"prob": mean_j p(y_j) over content tokens (all tokens if every one is whitespace),
    "match": every y_j is the argmax (greedy reproduces the target), "first_prob": p(y_1)}``,
    each an array with one entry per example.
    """
    encoded = encode(model, list(examples))
    blank: dict[int, bool] = {}
    out: dict[str, list[float]] = {"prob": [], "match": [], "first_prob": []}
    for chunk in batches(encoded, batch_size):
        batch = collate(chunk, pad_id(model.tokenizer), device=model.cfg.device)
        resid = capture(model, batch.tokens, "ln_final.hook_in")
        rows = [b for b, it in enumerate(chunk) for _ in it.answer_positions]
        pos = [p for it in chunk for p in it.answer_positions]
        tgt = torch.tensor([t for it in chunk for t in it.target_ids], device=resid.device)
        h = resid[torch.tensor(rows, device=resid.device), torch.tensor(pos, device=resid.device)]
        logits = unembed(model, h[:, None])[:, 0].float()
        p = logits.softmax(-1)
        p_t = p.gather(1, tgt[:, None])[:, 0].cpu()
        hit = (logits.argmax(-1) == tgt).cpu()
        start = 0
        for it in chunk:
            k = len(it.target_ids)
            for t in it.target_ids:
                if t not in blank:
                    blank[t] = not model.tokenizer.decode([t]).strip()
            keep = torch.tensor([not blank[t] for t in it.target_ids])
            probs = p_t[start : start + k]
            out["prob"].append(float((probs[keep] if keep.any() else probs).mean()))
            out["match"].append(float(hit[start : start + k].all()))
            out["first_prob"].append(float(p_t[start]))
            start += k
    return {k: np.asarray(v, dtype=float) for k, v in out.items()}


def measure(model: Any, examples: Sequence[Example], metric: str, batch_size: int = 16) -> dict[str, float]:
    """``{"value": the metric, "prob": mean target probability}`` of ``examples`` under ``model``.

    ``metric="accuracy"`` runs :func:`~capinterp.evaluate.evaluate` (greedy decoding) plus one
    teacher-forced pass for the probability; ``"target_prob"`` needs only the teacher-forced pass.
    """
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}; choose one of {', '.join(METRICS)}")
    if not examples:
        raise ValueError("measure() got no examples")
    prob = float(target_scores(model, examples, batch_size)["prob"].mean())
    if metric == "target_prob":
        return {"value": prob, "prob": prob}
    acc = evaluate(model, list(examples), batch_size=batch_size, progress=False).accuracy
    return {"value": float(acc), "prob": prob}
