"""Log-probabilities: capinterp's hand-built logit path and ``evaluate`` against plain transformers."""

from __future__ import annotations

import torch

from capinterp.testing.contract import require
from capinterp.testing.family_checks._models import PROMPTS, encode, load_pair

__all__ = ["CHECKS"]


def check_logprobs(family: str) -> None:
    """log p(next token) at the last position, capinterp vs transformers: 1e-6 relative (float64 softmax)."""
    from capinterp.arch.forward import logits_at

    hf, tok, model = load_pair(family)
    for text in PROMPTS:
        ids = encode(tok, text)
        with torch.no_grad():
            want = hf(ids).logits[0, -1].double().log_softmax(-1)
        got = logits_at(model, ids, torch.tensor([ids.shape[1] - 1]))[0].double().log_softmax(-1)
        rel = ((got - want).abs() / want.abs()).max().item()
        require(
            rel < 1e-6 or (got - want).abs().max().item() < 1e-5, lambda: f"{family}: log-prob relative error {rel:.3g}"
        )


def check_evaluate(family: str) -> None:
    """``ci.evaluate``'s mean p(target's first token) equals transformers' softmax at the prompt's end."""
    from capinterp.core.example import Example
    from capinterp.kernels.evaluate import evaluate

    hf, tok, model = load_pair(family)
    data = [Example(prompt=p, target=" Paris") for p in PROMPTS]
    got = evaluate(model, data).frame["prob"].to_numpy()
    for i, p in enumerate(PROMPTS):
        ids = encode(tok, p)
        target = tok(p + " Paris", return_tensors="pt")["input_ids"][0, ids.shape[1]]
        with torch.no_grad():
            want = hf(ids).logits[0, -1].double().softmax(-1)[target].item()
        require(abs(got[i] - want) <= 1e-5 * max(want, 1e-3), lambda: f"{family}: p(target) {got[i]:.6g} vs {want:.6g}")


CHECKS = {"logprobs": check_logprobs, "evaluate": check_evaluate}
