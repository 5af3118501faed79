"""The faithfulness metric of one batch of rows (shared by the neuron / layer and the edge paths)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["metric_rows"]


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
