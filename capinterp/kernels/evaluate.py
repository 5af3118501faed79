"""Accuracy (greedy decoding, parsed per format) and target probability of a dataset.

Interventions (:mod:`capinterp.interventions.hooks`) are hooks on the model, so ``evaluate`` inside
``with ci.erase(model, neurons):`` measures the intervened model.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import torch
from tqdm.auto import tqdm

from capinterp.arch.forward import logits_at
from capinterp.core import distributed as dist
from capinterp.core import validate
from capinterp.core.example import Example
from capinterp.core.protocol import Model
from capinterp.core.tokens import batches, encode, pad_id, pad_right

__all__ = ["EvalResult", "evaluate", "greedy_continuations"]


@dataclass
class EvalResult:
    """``accuracy`` and ``mean_prob`` (of the target's token: the first that carries the answer,
    :mod:`capinterp.core.tokens`) over ``n`` examples; ``examples`` in the order of ``records``."""

    accuracy: float
    mean_prob: float
    n: int
    records: list[dict[str, Any]] = field(default_factory=list, repr=False)
    examples: list[Example] = field(default_factory=list, repr=False)

    def correct(self) -> list[Example]:
        """The examples the model answered correctly, in dataset order: the data to localize a
        capability on (``ci.CNL(model).fit(ci.evaluate(model, ds).correct())``)."""
        if len(self.examples) != len(self.records):
            raise ValueError("this EvalResult holds no examples (it was built by hand); evaluate() fills them")
        return [ex for ex, r in zip(self.examples, self.records) if r["correct"]]

    @property
    def frame(self) -> pd.DataFrame:
        """One row per example: prompt tail, target, generated text, correct, prob."""
        return pd.DataFrame(self.records)

    def to_dict(self) -> dict[str, float]:
        """``{"accuracy", "mean_prob", "n"}`` as plain numbers."""
        return {"accuracy": self.accuracy, "mean_prob": self.mean_prob, "n": self.n}

    def __getitem__(self, key: str) -> float:
        return self.to_dict()[key]

    def __str__(self) -> str:
        return f"accuracy {self.accuracy:.3f}  mean p(target) {self.mean_prob:.3f}  (n={self.n})"


@torch.no_grad()
def greedy_continuations(model: Model, prompt_ids: list[list[int]], n_new: int) -> tuple[list[list[int]], torch.Tensor]:
    """Greedy-decode ``n_new`` tokens for each prompt; also return the first step's probabilities.

    Each step re-runs the right-padded batch (few steps are needed for short answers), so any
    hooks on the model apply to every generated token.
    """
    dev = model.cfg.device
    seqs = [list(p) for p in prompt_ids]
    first_probs = None
    for step in range(n_new):
        tokens, lengths = pad_right(seqs, pad_id(model.tokenizer))
        logits = logits_at(model, tokens.to(dev), lengths.to(dev) - 1)
        if step == 0:
            first_probs = logits.softmax(-1).cpu()
        nxt = logits.argmax(-1).tolist()
        for s, t in zip(seqs, nxt):
            s.append(int(t))
    if first_probs is None:
        raise ValueError(f"greedy_continuations needs n_new >= 1, got {n_new}")
    new = [s[len(p) :] for s, p in zip(seqs, prompt_ids)]
    return new, first_probs


def evaluate(
    model: Model,
    dataset: Iterable[Any],
    *,
    batch_size: int = 16,
    max_new_tokens: int | None = None,
    progress: bool | None = None,
) -> EvalResult:
    """Greedy accuracy and mean probability of the target's token.

    The target's token is the first one that carries the answer (whitespace the tokenizer keeps as
    a token of its own, SmolLM2's lone space before a digit, is context: :mod:`capinterp.core.tokens`),
    and ``correct`` is judged on the greedy continuation of the same context, so both are about the
    same tokens; each record names the scored token (``token``). ``max_new_tokens`` defaults to the
    longest target (in tokens) in each batch plus one, so a number or word that goes on ("12" for
    target "1", "Paris" for target "P") is caught. Answers are parsed per format
    (:func:`capinterp.data.parsing.is_correct`): DG integers, MQ letters, TF Yes/No; other targets
    must match the continuation's start as whole words.
    """
    from capinterp.data.parsing import is_correct

    validate.model(model)
    examples = validate.examples(dataset, "evaluate(dataset)")
    batch_size = validate.positive_int("batch_size", batch_size)
    if max_new_tokens is not None:
        validate.positive_int("max_new_tokens", max_new_tokens)
    encoded = encode(model, examples)
    show = len(encoded) > 4 * batch_size if progress is None else progress
    dist.init(model.cfg.device)  # under torchrun: each rank decodes every world_size-th batch
    mine: list[tuple[int, dict[str, Any]]] = []
    chunks = dist.shard(list(batches(list(range(len(encoded))), batch_size)))
    for idx in tqdm(chunks, desc="evaluate", disable=not (show and dist.is_main())):
        chunk = [encoded[i] for i in idx]
        n_new = max_new_tokens or (max(len(e.target_ids) for e in chunk) + 1)
        new, probs = greedy_continuations(model, [e.prompt_ids for e in chunk], n_new)
        for i, e, gen, pr in zip(idx, chunk, new, probs):
            text = model.tokenizer.decode(gen, skip_special_tokens=True)
            mine.append(
                (
                    i,
                    {
                        "prompt_tail": e.example.prompt[-40:],
                        "target": e.example.target,
                        "generated": text,
                        "correct": bool(is_correct(e.example, text)),
                        "prob": float(pr[e.target_ids[0]]),
                        "token": model.tokenizer.decode([e.target_ids[0]]),
                    },
                )
            )
    records = dist.gather_indexed(mine)
    frame = pd.DataFrame(records)
    return EvalResult(float(frame["correct"].mean()), float(frame["prob"].mean()), len(records), records, examples)
