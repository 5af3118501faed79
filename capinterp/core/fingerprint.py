"""Model identity: a fingerprint of the configuration, the name and the weights.

``model_fingerprint(model)`` hashes the config facts that fix the neuron layout, the model's
name and :func:`weights_digest`; ``architecture_fingerprint(model)`` hashes the config facts
only, for the one comparison that is meant to cross weights (sets located on checkpoints of one
architecture, ``across_models=True``).

The weights digest reads every parameter once: per tensor its name, shape, dtype and two
integer sums of its raw bits (int64, wrapping), the plain sum and a sum weighted by the row
index. Integer sums are exact and order-free, so the digest does not depend on the device
(by construction; tested on CPU) and costs one pass over the weights on their own device (SmolLM2: see
``benchmarks/bench_fingerprint.py``). It changes when any single entry changes (a flipped bit
changes the plain sum), when rows are swapped, on another seed, a fine-tune, an edit, a dtype
change. It can miss changes that cancel exactly in both sums (e.g. two entries swapped within
one row), which no training or editing step produces in practice.

It is computed once and cached on the model (``model.capinterp_weights``) together with each
parameter's identity and torch version counter; every in-place write through torch (optimizer
steps, ``with torch.no_grad(): w[...] = v``, capinterp's editing, fine-tuning and erasing by
weights) bumps the counter, so the next fingerprint is recomputed. Writes through ``p.data``
bypass the counter: call :func:`refresh_fingerprint` after them.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from capinterp.core.protocol import Model

__all__ = [
    "architecture_fingerprint",
    "hf_config_facts",
    "model_fingerprint",
    "refresh_fingerprint",
    "restoring",
    "weights_digest",
]

_CONFIG_KEYS = ("n_layers", "d_model", "d_mlp", "n_heads", "d_vocab", "n_ctx", "act_fn", "architecture")
_INT_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_CACHE = "capinterp_weights"


def _config_facts(model: Model) -> dict[str, Any]:
    cfg = model.cfg
    return {k: getattr(cfg, k, None) for k in _CONFIG_KEYS}


def _hash(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def architecture_fingerprint(model: Model) -> str:
    """Hash of the config facts that fix the neuron layout (name and weights excluded)."""
    return _hash(_config_facts(model))


def _tensor_sums(t: torch.Tensor) -> tuple[int, int]:
    """(sum of raw bits, row-weighted sum of raw bits), both int64 and exact on any device."""
    if t.device.type == "meta" or t.numel() == 0:
        return 0, 0
    x = t.detach()
    if x.dtype == torch.bool:
        x = x.to(torch.uint8)
    bits = x.contiguous().view(_INT_VIEW[x.element_size()]) if x.is_floating_point() else x
    rows = bits.reshape(bits.shape[0], -1) if bits.ndim >= 1 else bits.reshape(1, 1)
    per_row = rows.sum(dim=1, dtype=torch.int64)
    weights = torch.arange(1, per_row.numel() + 1, device=per_row.device, dtype=torch.int64)
    return int(per_row.sum()), int((per_row * weights).sum())


def _params(model: Model) -> list[tuple[str, torch.nn.Parameter]]:
    return list(model.named_parameters())  # shared parameters appear once


def _state(params: list[tuple[str, torch.nn.Parameter]]) -> tuple:
    return tuple((n, id(p), p.data_ptr(), p._version, p.dtype, str(p.device)) for n, p in params)


def weights_digest(model: Model) -> str:
    """Hash of every parameter's name, shape, dtype and raw-bit sums; cached until a weight changes."""
    params = _params(model)
    state = _state(params)
    cached = getattr(model, _CACHE, None)
    if cached is not None and cached[0] == state:
        return cached[1]
    with torch.no_grad():
        facts = [(n, list(p.shape), str(p.dtype), *_tensor_sums(p)) for n, p in params]
    digest = _hash(facts)
    try:
        setattr(model, _CACHE, (state, digest))
    except (AttributeError, TypeError):  # an object that refuses attributes: no cache
        pass
    return digest


def refresh_fingerprint(model: Model) -> None:
    """Forget the cached weights digest (after writes that bypass torch's version counter)."""
    if hasattr(model, _CACHE):
        delattr(model, _CACHE)


@contextmanager
def restoring(model: Model) -> Iterator[None]:
    """For weight writes that the block undoes exactly before it ends (temporary edits).

    After a normal exit the cached digest is kept for the restored weights, saving one pass over
    them; after an exception the cache is dropped, so the next fingerprint is recomputed.
    """
    digest = weights_digest(model)
    try:
        yield
    except BaseException:
        refresh_fingerprint(model)
        raise
    setattr(model, _CACHE, (_state(_params(model)), digest))


_HF_FACTS = "capinterp_hf_config_facts"


def hf_config_facts(model: Model) -> dict[str, Any] | None:
    """The wrapped transformers model's config (public fields), or None for a model without one.

    Fields such as a sliding window, rotary settings or norm epsilons change every activation
    while the weights stay the same, so caches keyed by the fingerprint must see them. The
    checkpoint's path, the transformers version and run-time switches (use_cache, output_*)
    are left out: they change no number.
    """
    frozen = getattr(model, _HF_FACTS, None)
    if frozen is not None:  # read once, as loaded: transformers and TransformerLens set some fields at run time
        return frozen
    hf = getattr(getattr(model, "original_model", None), "config", None)
    to_dict = getattr(hf, "to_dict", None)
    if not callable(to_dict):
        return None
    skip = {
        "transformers_version",
        "architectures",
        "use_cache",
        "output_attentions",
        "output_hidden_states",
        "return_dict",
    }
    facts = {k: v for k, v in to_dict().items() if not k.startswith("_") and k not in skip}
    try:
        setattr(model, _HF_FACTS, facts)
    except (AttributeError, TypeError):  # pragma: no cover - a model that refuses attributes
        pass
    return facts


def model_fingerprint(model: Model) -> str:
    """A short hash of the config facts (the transformers config's too), the model's name and its weights."""
    facts: dict[str, Any] = _config_facts(model)
    facts["hf_config"] = hf_config_facts(model)
    facts["name"] = getattr(model, "capinterp_name", None)
    facts["weights"] = weights_digest(model)
    return _hash(facts)
