"""Shared by the family checks: the tiny model of a family, loaded both ways, cached per process."""

from __future__ import annotations

import functools
from typing import Any

import torch

from capinterp.arch.tiny import tiny_hf
from capinterp.testing.contract import require

__all__ = ["PROMPTS", "load_pair", "plain_hf"]

PROMPTS = ("3+4=7 The Eiffel Tower is in", "Rome is the capital of")


@functools.lru_cache(maxsize=2)
def _pair(family: str) -> tuple[Any, Any, Any]:
    from capinterp.arch.model import load_model

    hf, tok = tiny_hf(family)
    return hf, tok, load_model(hf, tokenizer=tok)


def load_pair(family: str) -> tuple[Any, Any, Any]:
    """``(hf_model, tokenizer, bridge)`` sharing one set of weights; the bridge is loaded through
    :func:`capinterp.load_model` (which may raise ``UnsupportedFamily``). Cached: do not modify."""
    hf, tok, model = _pair(family)
    require(
        all(not p.requires_grad or p.grad is None for p in hf.parameters()),
        "failed: all(not p.requires_grad or p.grad is None for p in hf.parameters())",
    )
    return hf, tok, model


@functools.lru_cache(maxsize=2)
def plain_hf(family: str) -> Any:
    """A second, untouched transformers model with the same weights as :func:`load_pair`'s (the
    bridge wraps its own copy's submodules, so HF hooks on that copy would hook the bridge).
    Cached: do not modify."""
    from capinterp.testing.family_checks._one_sublayer_ref import reference_model

    hf = tiny_hf(family)[0]
    return reference_model(hf)


def encode(tok: Any, text: str) -> torch.Tensor:
    return tok(text, return_tensors="pt")["input_ids"]
