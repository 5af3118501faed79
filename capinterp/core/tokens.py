"""Turning Examples into token ids, with targets tokenized *in context*.

A target's tokens are those that follow the prompt's tokens in ``tokenize(prompt + target)``,
not ``tokenize(target)`` on its own: BPE merges depend on the left context (a leading space
can be its own token or merge into the next word). :func:`encode` checks that the prompt's
tokens are a prefix of the full text's tokens; when a merge crosses the prompt/target boundary
(e.g. the prompt ends in a space and the target starts with a word), the example cannot be
scored as written and :class:`TokenizationError` says which example and why, before any
long computation starts. The same error refuses a prompt that ends in whitespace the
tokenizer would attach to the target's first word (:func:`absorbed_whitespace`: ``"... of "`` +
``" Paris"`` tokenizes cleanly but feeds the model a lone space no real text has), and an empty
or whitespace-only target (:func:`capinterp.core.example.check_target`).
``on_mismatch="skip"`` drops boundary problems instead (and counts them).

*The target's token* is the first token that carries the answer, everywhere (IG objectives,
DCSN's projection, ``evaluate``'s ``prob``, faithfulness metrics, tracing, the editors): whitespace
that the tokenizer keeps as tokens of its own at the start of the target (SmolLM2 splits ``" 7"``
into ``" "`` and ``"7"``) is context, moved to the end of ``prompt_ids``, so ``" 1"``, ``" 7"`` and
``" 10"`` are scored by ``"1"``, ``"7"`` and ``"1"``, not by a shared lone space. A target whose
first character the tokenizer splits into byte fragments (an emoji on a byte-level BPE: its first
fragment is shared by many characters) is a :class:`TokenizationError`: no single token names it.
:func:`subject_span` is the one rule for where a subject string sits among a prompt's tokens
(causal tracing, ROME, attention scaling): it must start and end on token boundaries.

Sequences are right-padded: with causal attention, padding after the real tokens changes
nothing at the real positions, and positions stay aligned from the start (rotary-safe).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from capinterp.core import validate
from capinterp.core.example import Example, TokenizationError, check_target, glued_words
from capinterp.core.protocol import Model

__all__ = [
    "Encoded",
    "EncodedBatch",
    "TokenizationError",
    "absorbed_whitespace",
    "batches",
    "collate",
    "encode",
    "encode_prompt",
    "model_bos",
    "pad_id",
    "pad_right",
    "subject_span",
]


@dataclass
class Encoded:
    """One example as token ids: ``ids = prompt_ids + target_ids`` (BOS, if any, in prompt_ids)."""

    prompt_ids: list[int]
    target_ids: list[int]
    example: Example
    #: Whitespace-only tokens at the start of the target, moved to the end of ``prompt_ids`` (context:
    #: the first target token is the first one that carries the answer; see the module docstring).
    context_ws: int = 0

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


def model_bos(model: Model) -> list[int]:
    """BOS ids to prepend for this model (see :func:`_bos`)."""
    tok = getattr(model, "tokenizer", model)
    return _bos(tok, getattr(model, "capinterp_adds_bos", None))


def _ids(tokenizer, text: str) -> list[int]:
    """Token ids of ``text`` without any special tokens."""
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def absorbed_whitespace(tokenizer: Any, prompt: str, target: str) -> str | None:
    """The whitespace the prompt ends in, when the tokenizer would attach it to the target's first word.

    ``prompt`` ends in whitespace ``ws`` (``"... of "``), and ``ws`` followed by the target's first
    word does not keep ``ws``'s own tokens (``" " + "Paris"`` is one token ``" Paris"``): in real
    text the whitespace belongs to the answer's token, so a prompt cut after it is one the model
    never sees. Returns ``ws`` then, else None: no trailing whitespace, or a tokenizer that keeps
    it as its own token anyway (SmolLM2 and the tiny model before a digit, any tokenizer before
    a newline-led line of code).
    """
    body = prompt.rstrip()
    ws, word = prompt[len(body) :], target.lstrip()
    if not ws or not word:
        return None
    alone = _ids(tokenizer, ws)
    return ws if _ids(tokenizer, ws + word)[: len(alone)] != alone else None


def _shown(tokenizer: Any, ids: Sequence[int]) -> str:
    return "[" + ", ".join(repr(tokenizer.decode([t])) for t in ids) + "]"


def encode_prompt(model_or_tokenizer: Any, prompt: str) -> list[int]:
    """Token ids of a bare prompt (BOS as the model's convention, :func:`model_bos`), for greedy decoding."""
    tok = getattr(model_or_tokenizer, "tokenizer", model_or_tokenizer)
    return model_bos(model_or_tokenizer) + _ids(tok, prompt)


def encode(
    model_or_tokenizer: Any,
    examples: Sequence[Example],
    *,
    prepend_bos: bool | None = None,
    on_mismatch: str = "error",
    max_target_tokens: int | None = None,
    n_ctx: int | None = None,
    bare: str = "error",
) -> list[Encoded]:
    """Tokenize examples with targets in context; validate everything before returning.

    Raises :class:`TokenizationError` for an empty or whitespace-only target (also a bare
    prompt's, not yet filled with the greedy token), a target glued onto the prompt's last word
    (:func:`capinterp.core.example.glued_words`), a prompt/target boundary merge or a prompt
    ending in whitespace the target would absorb (:func:`absorbed_whitespace`; these three skipped
    with ``on_mismatch="skip"``), a first answer character split into byte fragments, or a sequence longer than the context ``n_ctx``
    (taken from the model when a model is passed). ``prepend_bos=None`` follows the
    tokenizer's own default (see :func:`_bos`). ``max_target_tokens`` truncates targets
    (e.g. 1 to score only the first answer token). ``bare="skip"`` leaves out bare prompts (whose
    greedy target is not filled in yet) after checking their length: localizers check their data
    with it before any model work, then fill the greedy targets and encode everything.
    """
    if on_mismatch not in ("error", "skip"):
        raise ValueError(f"on_mismatch must be 'error' or 'skip', got {on_mismatch!r}")
    validate.choice("bare", bare, ("error", "skip"))
    tok = getattr(model_or_tokenizer, "tokenizer", model_or_tokenizer)
    if n_ctx is None and hasattr(model_or_tokenizer, "cfg"):
        n_ctx = int(model_or_tokenizer.cfg.n_ctx)
    bos = model_bos(model_or_tokenizer) if prepend_bos is None else ([int(tok.bos_token_id)] if prepend_bos else [])
    out: list[Encoded] = []
    for i, ex in enumerate(examples):
        if on_mismatch == "skip" and glued_words(ex.prompt, ex.target) and ex.meta.get("target_from") != "greedy":
            continue  # a glued target is a boundary problem too
        check_target(ex, i)
        if not ex.target and bare == "skip":
            n = len(bos) + len(_ids(tok, ex.prompt))
            if n_ctx is not None and n >= n_ctx:  # the greedy token must fit after it
                raise TokenizationError(f"example {i} has {n} prompt tokens; the model's context is {n_ctx}")
            continue
        if not ex.target:
            raise TokenizationError(
                f"example {i} has an empty target (bare prompt {ex.prompt[-40:]!r}): this entry point needs "
                "the answer text (the neuron localizers fill in the model's greedy next token for bare prompts)"
            )
        p = _ids(tok, ex.prompt)
        full = _ids(tok, ex.prompt + ex.target)
        ws = absorbed_whitespace(tok, ex.prompt, ex.target)
        if ws is not None:
            if on_mismatch == "skip":
                continue
            word = ex.target.lstrip()
            raise TokenizationError(
                f"example {i}: the prompt {ex.prompt[-30:]!r} ends in whitespace {ws!r}, which the tokenizer "
                f"attaches to the word that follows ({ws + word[:12]!r} -> "
                f"{_shown(tok, _ids(tok, ws + word[:12]))}), so the model would see a prompt no real text "
                f"has. End the prompt before the whitespace and start the target with it: prompt "
                f"{ex.prompt.rstrip()[-30:]!r}, target {ws[-1:] + word!r}."
            )
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
        lead = _leading_whitespace(tok, t)
        _check_whole_first_char(tok, t[lead:], ex, i)
        p, t = p + t[:lead], t[lead:]
        if max_target_tokens is not None:
            t = t[:max_target_tokens]
        enc = Encoded(bos + p, t, ex, lead)
        if n_ctx is not None and len(enc.ids) > n_ctx:
            raise TokenizationError(f"example {i} has {len(enc.ids)} tokens; the model's context is {n_ctx}")
        out.append(enc)
    return out


def _leading_whitespace(tokenizer: Any, target_ids: Sequence[int]) -> int:
    """How many of the target's first tokens decode to whitespace only (at least one token stays)."""
    n = 0
    while n < len(target_ids) - 1 and not tokenizer.decode([target_ids[n]]).strip():
        n += 1
    return n


def _check_whole_first_char(tokenizer: Any, ids: Sequence[int], ex: Example, index: int) -> None:
    """TokenizationError when the answer's first token is a fragment of a character (byte-level BPE)."""
    first = tokenizer.decode([ids[0]])
    if "\ufffd" not in first or "\ufffd" in ex.target:
        return
    n = 1
    while n < len(ids) and tokenizer.decode(list(ids[:n])).endswith("\ufffd"):
        n += 1
    char = ex.target.strip()[:1]
    raise TokenizationError(
        f"example {index}: the target {ex.target!r} starts with {char!r}, which the tokenizer splits into "
        f"byte fragments {_shown(tokenizer, ids[:n])}; its first fragment is shared by other characters, "
        "so no single token names the answer. Start the target with a character the tokenizer keeps whole "
        "(e.g. a word before the emoji), or leave this example out."
    )


def subject_span(
    tokenizer: Any, text: str, subject: str, ids: Sequence[int] | None = None, *, offset: int = 0, start: int = 0
) -> tuple[int, int]:
    """Token positions ``[s0, s1)`` of ``subject``'s first occurrence in ``text`` at or after character ``start``.

    The one rule for subjects (causal tracing corrupts these positions, ROME edits at ``s1 - 1``,
    attention scaling scales them): the subject must start and end on token boundaries. A token
    that holds both subject characters and other non-whitespace characters (``"Eiffel Tow"`` in
    ``"... Eiffel Tower ..."``, ``"iffel"``) is a :class:`TokenizationError` showing the tokens;
    whitespace that a tokenizer glues to the subject's first token (``" Eiffel"``) is fine.
    ``ids`` are ``text``'s tokens without special tokens (computed when None); ``offset`` is added
    to the positions (the number of BOS tokens in front).
    """
    if not isinstance(subject, str) or not subject:
        raise ValueError(f"empty subject for prompt {text!r}")
    c0 = text.find(subject, start)
    if c0 < 0:
        raise ValueError(f"subject {subject!r} not found in prompt {text!r}")
    c1 = c0 + len(subject)
    ids = _ids(tokenizer, text) if ids is None else list(ids)
    spans = _char_spans(tokenizer, text, ids)
    hit = [i for i, (a, b) in enumerate(spans) if b > a and a < c1 and b > c0]
    if not hit:
        raise ValueError(f"subject {subject!r} maps to no token of prompt {text!r}")
    (a0, _), (_, b1) = spans[hit[0]], spans[hit[-1]]
    if text[a0:c0].strip() or text[c1:b1].strip():
        shown = ", ".join(repr(tokenizer.decode([ids[i]])) + ("*" if i in hit else "") for i in range(len(ids)))
        raise TokenizationError(
            f"subject {subject!r} does not {'start' if text[a0:c0].strip() else 'end'} on a token boundary in "
            f"{text!r}: its tokens (*) are [{shown}], which cover {text[a0:b1]!r}. Give the subject as whole "
            "tokens (e.g. the full word)."
        )
    return hit[0] + offset, hit[-1] + 1 + offset


def _char_spans(tokenizer: Any, text: str, ids: list[int]) -> list[tuple[int, int]]:
    """Character span of each token of ``text``: the offset mapping, or (slow tokenizers) decoded prefix lengths."""
    try:
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        if list(enc["input_ids"]) == ids:
            return [(int(a), int(b)) for a, b in enc["offset_mapping"]]
    except (NotImplementedError, TypeError, ValueError, KeyError):
        pass
    spans, prev = [], 0
    for i in range(len(ids)):
        end = len(tokenizer.decode(ids[: i + 1]))
        spans.append((prev, end))
        prev = end
    return spans


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
