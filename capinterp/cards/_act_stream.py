"""Texts to batches, and one forward per batch that reads every requested unit's activation.

Texts are tokenized as the model reads plain text (:func:`capinterp.core.tokens.encode_prompt`: BOS
only where the model's tokenizer adds one), checked against the context before any forward, sorted
by length within this rank's shard (less padding) and right-padded. Each forward hooks once per
layer that holds requested units, copies the requested columns of all of them into one
``[B, T, n]`` float32 tensor, and stops after the last layer needed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from tqdm.auto import tqdm

from capinterp.arch.forward import capture
from capinterp.core import distributed as dist
from capinterp.core.protocol import Model
from capinterp.core.tokens import model_bos, pad_id, pad_right

__all__ = ["Plan", "batches_of", "encode_texts", "read_batch", "stream"]


def encode_texts(model: Model, texts: Sequence[str], max_tokens: int | None) -> list[list[int]]:
    """Token ids of every text (truncated to ``max_tokens``); ValueError naming the first text that
    is empty or longer than the model's context."""
    tok = model.tokenizer
    bos = model_bos(model)
    ids = [bos + list(t) for t in tok(list(texts), add_special_tokens=False)["input_ids"]]
    n_ctx = int(model.cfg.n_ctx)
    for i, seq in enumerate(ids):
        if max_tokens is not None:
            del seq[max_tokens:]
        if not seq:
            raise ValueError(f"text {i} ({texts[i][:40]!r}) has no tokens: leave empty texts out")
        if len(seq) > n_ctx:
            fix = "lower max_tokens" if max_tokens is not None else "pass max_tokens= to truncate the texts"
            raise ValueError(
                f"text {i} ({texts[i][:40]!r}...) has {len(seq)} tokens; the model's context is {n_ctx}: {fix}"
            )
    return ids


class Plan:
    """Which columns of which layer's hook the requested units read, and how the layers' columns,
    concatenated in layer order, are put back in the order the units were given."""

    def __init__(self, units: Sequence[tuple[int, int]], hook: Callable[[int], str], device: Any) -> None:
        self.n = len(units)
        self.layers: dict[int, torch.Tensor] = {}
        placed: list[int] = []
        for layer in sorted({u[0] for u in units}):
            slots = [s for s, u in enumerate(units) if u[0] == layer]
            self.layers[layer] = torch.tensor([units[s][1] for s in slots], dtype=torch.long, device=device)
            placed += slots
        back = torch.empty(self.n, dtype=torch.long)
        back[torch.tensor(placed)] = torch.arange(self.n)
        self.order = None if placed == sorted(placed) else back.to(device)
        self.hook = hook


def batches_of(ids: list[list[int]], batch_size: int) -> list[list[int]]:
    """This rank's text indices in batches, longest texts first (texts of like length share a batch)."""
    mine = sorted(dist.shard(range(len(ids))), key=lambda i: (-len(ids[i]), i))
    return [mine[s : s + batch_size] for s in range(0, len(mine), batch_size)]


def read_batch(model: Model, plan: Plan, tokens: torch.Tensor) -> torch.Tensor:
    """``[B, T, n]`` float32: every planned unit's activation at every position of ``tokens``."""
    B, T = tokens.shape
    parts: dict[int, torch.Tensor] = {}

    def grabber(layer: int, cols: torch.Tensor):
        def grab(x, hook):
            if x.shape[:2] != (B, T):
                raise ValueError(f"{hook.name} has shape {tuple(x.shape)}: expected [batch, pos, units]")
            if int(cols.max()) >= x.shape[-1]:
                raise ValueError(f"unit index {int(cols.max())} is out of range: {hook.name} has {x.shape[-1]} units")
            parts[layer] = x.index_select(-1, cols.to(x.device)).to(tokens.device, torch.float32)
            return x

        return grab

    layers = sorted(plan.layers)
    hooks = [(plan.hook(l), grabber(l, plan.layers[l])) for l in layers]
    last_name, last_fn = hooks[-1]
    last = capture(model, tokens, last_name, fwd_hooks=hooks[:-1])
    last_fn(last, _Named(last_name))
    if missing := [l for l in layers if l not in parts]:
        raise RuntimeError(f"hooks {[plan.hook(l) for l in missing]} did not fire: this model has no such hooks")
    acts = torch.cat([parts[l] for l in layers], -1) if len(layers) > 1 else parts[layers[0]]
    return acts if plan.order is None else acts.index_select(-1, plan.order)


class _Named:
    def __init__(self, name: str) -> None:
        self.name = name


def stream(
    model: Model,
    ids: list[list[int]],
    read: Callable[[torch.Tensor], torch.Tensor],
    batch_size: int,
    progress: bool,
    desc: str = "top contexts",
) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """``(acts [B, T, n], real [B, T], text_index [B])`` per batch of this rank's texts, ``acts``
    being ``read(tokens)`` (:func:`read_batch` for units of a hook; a layer's output norm)."""
    dev = torch.device(model.cfg.device)
    pad = pad_id(model.tokenizer)
    groups = batches_of(ids, batch_size)
    for group in tqdm(groups, desc=desc, unit="batch", disable=not (progress and dist.is_main())):
        tokens, lengths = pad_right([ids[i] for i in group], pad)
        tokens, lengths = tokens.to(dev), lengths.to(dev)
        with torch.no_grad():
            acts = read(tokens)
        real = torch.arange(tokens.shape[1], device=dev)[None] < lengths[:, None]
        yield acts, real, torch.tensor(group, dtype=torch.long, device=dev)
