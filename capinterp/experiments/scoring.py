"""How well a (possibly intervened) model does on one capability's examples, in one number.

Two metrics, each named in every experiment table's ``metric`` column:

- ``"accuracy"``: greedy accuracy from :func:`capinterp.kernels.evaluate.evaluate` (answers parsed per
  format; for plain-text targets, the stripped continuation must start with the stripped target).
  Meaningful for arithmetic (one number) and sentiment (one label word).
- ``"target_prob"``: the mean over the target's *content* tokens of ``p(y_j | x + y_<j)``,
  teacher-forced, averaged over examples -- CNL's objective F (Huang et al. 2025, Eq. 7) without the
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

from collections.abc import Sequence

import numpy as np
import torch

from capinterp.arch.forward import capture, unembed
from capinterp.core.example import Example
from capinterp.core.protocol import Model
from capinterp.core.tokens import batches, collate, encode, pad_id
from capinterp.data.parsing import is_correct, parse_answer
from capinterp.kernels.evaluate import evaluate

__all__ = ["TASK_METRICS", "greedy_accuracy", "greedy_correct", "measure", "surely_wrong", "target_scores"]

TASK_METRICS: tuple[str, ...] = ("accuracy", "target_prob")


@torch.no_grad()
def target_scores(model: Model, examples: Sequence[Example], batch_size: int = 16) -> dict[str, np.ndarray]:
    """Per-example teacher-forced target statistics, one forward per batch (hooks on the model apply).

    Examples are batched by length (less padding) and returned in input order. Returns arrays
    with one entry per example: ``prob`` (mean p(y_j) over content tokens; over all
    tokens if every one is whitespace), ``match`` (1.0 when every y_j is the argmax, i.e. greedy
    decoding reproduces the target), ``first_prob`` (p(y_1)) and ``next_id`` (the argmax token
    after the whole target: what greedy decoding adds after reproducing it).
    """
    encoded = encode(model, list(examples))
    blank: dict[int, bool] = {}
    keys = ("prob", "match", "first_prob", "first_id", "next_id")
    out: dict[str, list[float]] = {k: [0.0] * len(encoded) for k in keys}
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i].ids))  # similar lengths share a batch
    for idx in batches(order, batch_size):
        chunk = [encoded[i] for i in idx]
        batch = collate(chunk, pad_id(model.tokenizer), device=model.cfg.device)
        resid = capture(model, batch.tokens, "ln_final.hook_in")
        spans = [it.answer_positions + [len(it.ids) - 1] for it in chunk]  # + the position after the target
        rows = torch.tensor([b for b, sp in enumerate(spans) for _ in sp], device=resid.device)
        pos = torch.tensor([p for sp in spans for p in sp], device=resid.device)
        logits = unembed(model, resid[rows, pos][:, None])[:, 0].float()
        top = logits.argmax(-1).cpu()
        logp = logits.log_softmax(-1)
        start = 0
        for i, it in zip(idx, chunk):
            k = len(it.target_ids)
            tgt = torch.tensor(it.target_ids)
            p_t = logp[start : start + k].gather(1, tgt[:, None].to(logp.device))[:, 0].exp().cpu()
            for t in it.target_ids:
                if t not in blank:
                    blank[t] = not model.tokenizer.decode([t]).strip()
            keep = torch.tensor([not blank[t] for t in it.target_ids])
            out["prob"][i] = float((p_t[keep] if keep.any() else p_t).mean())
            out["match"][i] = float((top[start : start + k] == tgt).all())
            out["first_prob"][i] = float(p_t[0])
            out["first_id"][i] = int(top[start])
            out["next_id"][i] = int(top[start + k])
            start += k + 1
    return {k: np.asarray(v, dtype=int if k.endswith("_id") else float) for k, v in out.items()}


def surely_wrong(example: Example, first: str) -> bool:
    """Whether every greedy continuation starting with the text ``first`` is judged wrong.

    Plain targets: the stripped continuation starts with ``first.lstrip()``, which is neither a
    prefix of the stripped target nor starts with it. ``DG``: the text cannot start a number,
    or starts one with a nonzero digit the answer does not start with. Anything else (blank or
    partial-byte text, a leading ``0`` or minus sign, ``MQ`` / ``TF``) is undecided: False.
    """
    head = first.lstrip()
    if not head or "\ufffd" in head:
        return False
    fmt = example.meta.get("fmt")
    if fmt is None:
        gold = example.target.strip()
        return bool(gold) and not (gold.startswith(head) or head.startswith(gold))
    if fmt == "DG":
        want = parse_answer("DG", example.target) or ""
        c = head[0]
        if c in "123456789":
            return not want.startswith(c)
        return not (c.isdigit() or c in "-\u2212")
    return False


def greedy_correct(
    model: Model, examples: Sequence[Example], stats: dict[str, np.ndarray] | None = None, batch_size: int = 16
) -> list[bool]:
    """Per example, :func:`~capinterp.kernels.evaluate.evaluate`'s verdict, decoding only where needed.

    The teacher-forced pass (:func:`target_scores`) already holds greedy's first token and, where
    greedy reproduces the whole target (``match``), its continuation: the target plus
    ``next_id``; that text is scored directly (``evaluate``'s longer continuation cannot change
    the verdict: a number is already ended or already wrong, a text target already matched).
    Where the first token alone settles it (:func:`surely_wrong`) the example is wrong. Only the
    rest are decoded by ``evaluate``.
    """
    exs = list(examples)
    stats = target_scores(model, exs, batch_size) if stats is None else stats
    encoded = encode(model, exs)
    correct = [False] * len(exs)
    todo = []
    decode = model.tokenizer.decode
    for i, (enc, m, first, nxt) in enumerate(zip(encoded, stats["match"], stats["first_id"], stats["next_id"])):
        if m:
            correct[i] = bool(is_correct(enc.example, decode(enc.target_ids + [int(nxt)], skip_special_tokens=True)))
        elif not surely_wrong(enc.example, decode([int(first)], skip_special_tokens=True)):
            todo.append(i)
    if todo:
        todo.sort(key=lambda i: len(encoded[i].ids))  # similar lengths share a batch
        recs = evaluate(model, [exs[i] for i in todo], batch_size=batch_size, progress=False).records
        for i, r in zip(todo, recs):
            correct[i] = bool(r["correct"])
    return correct


def greedy_accuracy(
    model: Model, examples: Sequence[Example], stats: dict[str, np.ndarray] | None = None, batch_size: int = 16
) -> float:
    """:func:`~capinterp.kernels.evaluate.evaluate`'s accuracy via :func:`greedy_correct`."""
    return float(np.mean(greedy_correct(model, examples, stats, batch_size)))


def measure(model: Model, examples: Sequence[Example], metric: str, batch_size: int = 16) -> dict[str, float]:
    """``{"value": the metric, "prob": mean target probability}`` of ``examples`` under ``model``.

    ``metric="accuracy"`` is :func:`greedy_accuracy` (greedy decoding only where the teacher-forced
    pass cannot decide); ``"target_prob"`` needs only the teacher-forced pass.
    """
    if metric not in TASK_METRICS:
        raise ValueError(f"unknown metric {metric!r}; choose one of {', '.join(TASK_METRICS)}")
    if not examples:
        raise ValueError("measure() got no examples")
    stats = target_scores(model, examples, batch_size)
    prob = float(stats["prob"].mean())
    if metric == "target_prob":
        return {"value": prob, "prob": prob}
    return {"value": greedy_accuracy(model, examples, stats, batch_size), "prob": prob}
