"""A final norm that also normalizes the embeddings (NanoChat).

NanoChat's transformers model calls one module, ``model.norm`` (weightless RMSNorm), twice per
forward: on the embeddings before the first layer, and on the last residual before the
unembedding. The bridge maps that module to ``ln_final``, so ``ln_final``'s hooks fire twice and
the first firing carries the embeddings: every method that reads the final residual at
``ln_final.hook_in`` (capinterp's hand-built logits among them) would read the embeddings.

At load, :func:`final_norm_order` watches the first (guarded) forward for a final-norm call before
the first block (read from the modules, not the family name); :func:`install` then routes every call the transformers model
makes through that attribute before its first decoder layer to the plain module (no hooks), so
``ln_final`` fires once per forward, on the last residual. The normalized embeddings are what
``blocks.0.hook_resid_pre`` sees, as on any family; ``hook_embed`` stays the raw embedding.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

from capinterp.core.protocol import Model

__all__ = ["final_norm_order", "install"]


def _owner(model: Model) -> tuple[torch.nn.Module, str] | None:
    """The transformers module and attribute name that hold the bridge's ``ln_final``."""
    for mod in model.original_model.modules():
        for name, child in mod.named_children():
            if child is model.ln_final:
                return mod, name
    return None


@contextlib.contextmanager
def final_norm_order(model: Model) -> Iterator[Callable[[], bool]]:
    """Watch the forwards run inside: yields a check of whether one called the final norm before the
    first block (on the embeddings)."""
    order: list[str] = []
    handles = [
        model.ln_final.register_forward_pre_hook(lambda m, a: order.append("norm")),
        model.blocks[0].register_forward_pre_hook(lambda m, a: order.append("block")),
    ]
    try:
        yield lambda: "block" in order and "norm" in order[: order.index("block")]
    finally:
        for h in handles:
            h.remove()


class _BeforeBlocks(torch.nn.Module):
    """Stands in for the final norm where the transformers model calls it: the plain module until
    the first block has run in this forward, the bridge's ``ln_final`` (with its hooks) after."""

    _norm: torch.nn.Module
    _plain: torch.nn.Module
    _started: list[bool]

    def __init__(self, bridge_norm: torch.nn.Module, plain: torch.nn.Module, first_block: torch.nn.Module):
        super().__init__()
        # kept outside the module tree: the bridge already owns both, and no parameter may appear twice
        self.__dict__["_norm"] = bridge_norm
        self.__dict__["_plain"] = plain
        self.__dict__["_started"] = [False]
        # bound methods, not closures: a deep copy of the model (copy_model) copies their instance with it
        first_block.register_forward_pre_hook(self.start)

    def start(self, module: Any = None, args: Any = None) -> None:
        self._started[0] = True

    def reset(self, module: Any = None, args: Any = None) -> None:
        self._started[0] = False

    def forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if self._started[0]:
            return self._norm(x, *args, **kwargs)
        return self._plain(x, *args, **kwargs)


def install(model: Model) -> None:
    """Route the embeddings' normalization around ``ln_final``'s hooks (see the module docstring)."""
    from capinterp.arch.family import UnsupportedFamily, family_of

    found = _owner(model)
    plain = getattr(model.ln_final, "original_component", None)
    decoder = model.original_model.get_decoder() if hasattr(model.original_model, "get_decoder") else None
    if found is None or not isinstance(plain, torch.nn.Module) or not isinstance(decoder, torch.nn.Module):
        fam = family_of(model)
        raise UnsupportedFamily(
            f"{fam.name} ({fam.architecture}): its final norm also normalizes the embeddings before the first "
            "layer, and capinterp could not find where the transformers model holds it to keep the two calls apart"
        )
    owner, name = found
    stand_in = _BeforeBlocks(model.ln_final, plain, model.blocks[0])
    decoder.register_forward_pre_hook(stand_in.reset)
    owner.__dict__.pop(name, None)
    owner._modules.pop(name)
    object.__setattr__(owner, name, stand_in)  # an attribute, not a child: the module tree keeps ln_final once
