"""The type of the model every capinterp function takes: a ``TransformerBridge``, as a protocol.

capinterp works through what TransformerLens' bridge offers (hook points, ``run_with_hooks``,
its config, tokenizer and blocks), plus the per-model record of architecture facts that
:func:`capinterp.arch.model.load_model` attaches (:func:`capinterp.arch.family.family_of`).
The protocol names the members capinterp relies on everywhere; everything else on the bridge
(its blocks, norms, unembedding, the wrapped transformers model) is reached by attribute and
typed ``Any`` through ``__getattr__``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol, runtime_checkable

import torch

__all__ = ["Model"]


@runtime_checkable
class Model(Protocol):
    """A ``TransformerBridge`` (or anything that quacks like one): see the module docstring."""

    cfg: Any
    tokenizer: Any

    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...

    def run_with_hooks(self, *args: Any, **kwargs: Any) -> Any: ...

    def parameters(self, recurse: bool = True) -> Iterator[torch.nn.Parameter]: ...

    def __getattr__(self, name: str) -> Any: ...

    def __setattr__(self, name: str, value: Any) -> None: ...
