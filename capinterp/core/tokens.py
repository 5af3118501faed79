"""Turning Examples into token ids, with targets tokenized *in context*.

A target's tokens are those that follow the prompt's tokens in ``tokenize(prompt + target)``,
not ``tokenize(target)`` on its own: BPE merges depend on the left context (a leading space
can be its own token or merge into the next word). :func:`encode` checks that the prompt's
tokens are a prefix of the full text's tokens; when a merge crosses the prompt/target boundary
(e.g. the prompt ends in a space and the target starts with a word), the example cannot be
scored as written and :class:`TokenizationError` says which example and why, before any
long computation starts. ``on_mismatch="skip"`` drops such examples instead (and counts them).

Sequences are right-padded: with causal attention, padding after the real tokens changes
nothing at the real positions, and positions stay aligned from the start (rotary-safe).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from capinterp.core import validate
from capinterp.core.example import Example

__all__ = [
    "Encoded",
    "EncodedBatch",
    "TokenizationError",
    "batches",
    "collate",
    "encode",
    "model_bos",
    "pad_id",
    "pad_right",
]


class TokenizationError(ValueError):
    """An example's target does not tokenize as expected after its prompt."""


@dataclass
class Encoded:
    """One example as token ids: ``ids = prompt_ids + target_ids`` (BOS, if any, in prompt_ids)."""

    prompt_ids: list[int]
    target_ids: list[int]
    example: Example

    @property
    def ids(self) -> list[int]:
        """Prompt then target token ids, ``[len(prompt_ids) + len(target_ids)]``."""
        return self.prompt_ids + self.target_ids

    @property
    def last_prompt_pos(self) -> int:
        """Position of the last prompt token (where the first target token is predicted)."""
        return len(self.prompt_ids) - 1

    @property
    def answer_positions(self) -> list[int]:
        """Positions whose next-token prediction is an answer token: |x|-1 .. |x|+|y|-2."""
        n = len(self.prompt_ids)
        return list(range(n - 1, n - 1 + len(self.target_ids)))


@dataclass
class EncodedBatch:
    """Right-padded batch. ``lengths[b]`` real tokens in row ``b``."""

    tokens: torch.Tensor  # [B, T] long
    lengths: torch.Tensor  # [B] long
    items: list[Encoded] = field(default_factory=list)


def _bos(tokenizer, adds_bos: bool | None = None) -> list[int]:
    """The BOS token if the model's own tokenizer adds one by default (Gemma: yes; SmolLM2: no).

    Following the tokenizer's own convention matters: SmolLM2's BOS is ``<|im_start|>``, and
    prepending it to plain text halves its arithmetic accuracy. ``load_model`` records the
    convention as ``model.capinterp_adds_bos`` before TransformerLens reconfigures the
    tokenizer; for a bare tokenizer it is read off ``tokenizer("a")``.
    """
    bos = getattr(tokenizer, "bos_token_id", None)
    if bos is None:
        return []
    if adds_bos is None:
        ids = tokenizer("a")["input_ids"]
        adds_bos = bool(ids) and ids[0] == bos
    return [int(bos)] if adds_bos else []


def model_bos(model) -> list[int]:
    """BOS ids to prepend for this model (see :func:`_bos`)."""
    tok = getattr(model, "tokenizer", model)
    return _bos(tok, getattr(model, "capinterp_adds_bos", None))


def _ids(tokenizer, text: str) -> list[int]:
    """Token ids of ``text`` without any special tokens."""
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def encode(
    model_or_tokenizer: Any,
    examples: Sequence[Example],
    *,
    prepend_bos: bool | None = None,
    on_mismatch: str = "error",
    max_target_tokens: int | None = None,
    n_ctx: int | None = None,
) -> list[Encoded]:
    """Tokenize examples with targets in context; validate everything before returning.

    Raises :class:`TokenizationError` for an empty target, a prompt/target boundary merge
    (unless ``on_mismatch="skip"``), or a sequence longer than the context ``n_ctx``
    (taken from the model when a model is passed). ``prepend_bos=None`` follows the
    tokenizer's own default (see :func:`_bos`). ``max_target_tokens`` truncates targets
    (e.g. 1 to score only the first answer token).
    """
    if on_mismatch not in ("error", "skip"):
        raise ValueError(f"on_mismatch must be 'error' or 'skip', got {on_mismatch!r}")
    tok = getattr(model_or_tokenizer, "tokenizer", model_or_tokenizer)
    if n_ctx is None and hasattr(model_or_tokenizer, "cfg"):
        n_ctx = int(model_or_tokenizer.cfg.n_ctx)
    bos = model_bos(model_or_tokenizer) if prepend_bos is None else ([int(tok.bos_token_id)] if prepend_bos else [])
    out: list[Encoded] = []
    for i, ex in enumerate(examples):
        if not ex.target:
            raise TokenizationError(f"example {i} has an empty target (prompt {ex.prompt[-40:]!r})")
        p = _ids(tok, ex.prompt)
        full = _ids(tok, ex.prompt + ex.target)
        if full[: len(p)] != p or len(full) == len(p):
            if on_mismatch == "skip":
                continue
            raise TokenizationError(
                f"example {i}: target {ex.target!r} does not tokenize as separate tokens after prompt "
                f"ending {ex.prompt[-30:]!r} (a BPE merge crosses the boundary, e.g. a trailing space "
                "in the prompt). End the prompt where the target's first token starts, or pass "
                "on_mismatch='skip'."
            )
        t = full[len(p) :]
        if max_target_tokens is not None:
            t = t[:max_target_tokens]
        enc = Encoded(bos + p, t, ex)
        if n_ctx is not None and len(enc.ids) > n_ctx:
            raise TokenizationError(f"example {i} has {len(enc.ids)} tokens; the model's context is {n_ctx}")
        out.append(enc)
    return out


def collate(items: Sequence[Encoded], pad_id: int, *, with_target: bool = True, device=None) -> EncodedBatch:
    """Right-pad ``prompt+target`` (or prompt only) ids into one tensor."""
    tokens, lengths = pad_right([it.ids if with_target else it.prompt_ids for it in items], pad_id)
    return EncodedBatch(tokens.to(device), lengths.to(device), list(items))


def pad_right(seqs: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``([B, T] long tokens, [B] lengths)`` with each sequence right-padded by ``pad_id``."""
    T = max(len(s) for s in seqs)
    tokens = torch.full((len(seqs), T), pad_id, dtype=torch.long)
    for b, s in enumerate(seqs):
        tokens[b, : len(s)] = torch.tensor(list(s), dtype=torch.long)
    return tokens, torch.tensor([len(s) for s in seqs], dtype=torch.long)


def pad_id(tokenizer) -> int:
    """The token id used for right padding: the tokenizer's pad, else its EOS, else its BOS token."""
    for attr in ("pad_token_id", "eos_token_id", "bos_token_id"):
        v = getattr(tokenizer, attr, None)
        if v is not None:
            return int(v)
    return 0


def batches(items: Sequence[Any], batch_size: int):
    """Consecutive chunks of ``batch_size`` (the last may be shorter)."""
    batch_size = validate.positive_int("batch_size", batch_size)
    for s in range(0, len(items), batch_size):
        yield items[s : s + batch_size]
