"""The uncentred second moment C = E[k k^T] of one layer's MLP keys, for ROME's update.

A key k is the input of layer ``l``'s down projection (``blocks.{l}.mlp.hook_post``, ``[d_mlp]``)
at one token. ROME (Meng et al. 2022, Sec. 3.1, Eq. 2) spreads its rank-one update along
``C^{-1} k*`` so that keys the layer usually sees move least; C comes from 100k Wikipedia
tokens in the paper, here from local text: the caller's ``texts``, or a seeded sample of the
files under ``data_dir`` (:func:`capinterp.data.local_texts`). Nothing is downloaded.

The result is cached under ``$CAPINTERP_CACHE/second_moment/``, keyed by the model fingerprint,
the layer and a hash of the exact token sequences, so another corpus never reuses it.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence

import torch

from capinterp.arch.forward import capture
from capinterp.arch.model import cache_dir, model_fingerprint, neuron_hook
from capinterp.core.protocol import Model
from capinterp.core.tokens import batches, model_bos, pad_id, pad_right
from capinterp.data.corpus import local_texts

__all__ = ["key_corpus", "second_moment"]


def key_corpus(
    model: Model,
    *,
    texts: Sequence[str] | None = None,
    data_dir: str | os.PathLike | None = None,
    n_texts: int = 400,
    max_tokens: int = 64,
) -> list[list[int]]:
    """The token sequences :func:`second_moment` reads (BOS first where the model prepends one, each
    cut to ``max_tokens``); every input error is raised here, before any forward pass."""
    if max_tokens < 2:
        raise ValueError(f"max_tokens must be >= 2, got {max_tokens}")
    if texts is None:
        texts = local_texts(data_dir, n=n_texts)
    elif isinstance(texts, str) or not all(isinstance(t, str) for t in texts):
        raise TypeError("texts must be a list of strings")
    bos = model_bos(model)
    tok = model.tokenizer
    seqs = [
        ids
        for ids in (bos + list(tok(t, add_special_tokens=False)["input_ids"])[: max_tokens - len(bos)] for t in texts)
        if len(ids) > len(bos)
    ]
    if not seqs:
        raise ValueError("texts must hold at least one non-empty text")
    return seqs


def second_moment(
    model: Model,
    layer: int,
    *,
    texts: Sequence[str] | None = None,
    data_dir: str | os.PathLike | None = None,
    n_texts: int = 400,
    max_tokens: int = 64,
    batch_size: int = 8,
    cache: bool = True,
    neurons: slice | None = None,
) -> tuple[torch.Tensor, int]:
    """``(C, n_keys)``: C = mean over the corpus's tokens of k k^T, ``[d_mlp, d_mlp]`` float32 on the CPU.

    Every text is cut to ``max_tokens`` tokens; the BOS position (where the model prepends one)
    is left out: it is an attention sink whose keys are outliers, not text. ``neurons`` (a slice of
    the layer's neuron axis: one expert's neurons, for per-expert ROME) keeps only those keys, so C
    is ``[n, n]`` (the keys of tokens not routed to the expert are 0 and count, as in the full C).
    """
    n_layers = int(model.cfg.n_layers)
    if not isinstance(layer, int) or not 0 <= layer < n_layers:
        raise ValueError(f"layer must be an int in [0, {n_layers}), got {layer!r}")
    seqs = key_corpus(model, texts=texts, data_dir=data_dir, n_texts=n_texts, max_tokens=max_tokens)
    bos, tok = model_bos(model), model.tokenizer
    digest = hashlib.sha256(repr(seqs).encode()).hexdigest()[:16]
    part = "" if neurons is None else f"-N{neurons.start}-{neurons.stop}"
    path = cache_dir() / "second_moment" / f"{model_fingerprint(model)}-L{layer}{part}-{digest}.pt"
    if cache and path.is_file():
        saved = torch.load(path, map_location="cpu")
        return saved["C"], int(saved["n"])
    cols = slice(None) if neurons is None else neurons
    width, dev = len(range(int(model.cfg.d_mlp))[cols]), model.cfg.device
    acc = torch.zeros(width, width, dtype=torch.float64, device=dev)
    n = 0
    with torch.no_grad():
        for chunk in batches(seqs, batch_size):
            tokens, lengths = pad_right(chunk, pad_id(tok))
            keys = capture(model, tokens.to(dev), neuron_hook(layer))
            pos = torch.arange(tokens.shape[1], device=dev)[None]
            real = (pos < lengths.to(dev)[:, None]) & (pos >= len(bos))
            k = keys[real][:, cols].double()
            acc += k.T @ k
            n += k.shape[0]
    C = (acc / n).float().cpu()
    if cache:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        torch.save({"C": C, "n": n}, tmp)
        os.replace(tmp, path)
    return C, n
