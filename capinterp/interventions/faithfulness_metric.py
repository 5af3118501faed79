"""The faithfulness metric of one batch of rows (shared by the neuron / layer and the edge paths)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from capinterp.circuits.eap import make_pairs

__all__ = ["corrupt_pairs", "metric_rows"]


def metric_rows(logits: torch.Tensor, rows: Sequence[int], items: Any, pairs: Any, metric: str) -> torch.Tensor:
    """``[n]``: p / log p of each row's first target token, or its logit minus the corrupted answer's
    (``pairs``); ``logits`` ``[n, vocab]`` at the last prompt position of items ``rows``."""
    target = torch.tensor([items[i].target_ids[0] for i in rows], device=logits.device)
    r = torch.arange(len(rows), device=logits.device)
    if metric == "prob":
        return logits.softmax(-1)[r, target]
    if metric == "logprob":
        return logits.log_softmax(-1)[r, target]
    other = torch.tensor([pairs[i].corrupt_label for i in rows], device=logits.device)
    return logits[r, target] - logits[r, other]


def corrupt_pairs(model: Any, items: Sequence[Any], corrupt: Any) -> list:
    """Each item's corrupted prompt (:func:`capinterp.circuits.eap.make_pairs`; ``corrupt``: None for
    subject swaps, or a callable); refused when any example has none."""
    pairs = make_pairs(model, [it.example for it in items], corrupt=corrupt)
    noise = [i for i, p in enumerate(pairs) if p.mode == "noise"]
    if noise:
        raise ValueError(
            f"ablation='corrupt' needs a corrupted prompt for every example; {len(noise)} of {len(pairs)} have none "
            "(no subject swap fits: pass corrupt= a callable, or use ablation='mean')"
        )
    return pairs
