"""How a module stores a linear weight: ``nn.Linear``'s ``[out, in]`` or transformers' ``Conv1D`` ``[in, out]``.

The one place that tells the two layouts apart (from the module's attributes and weight shape,
never its class name); the family record, the weight readers and the family checks all ask here.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

__all__ = ["is_conv1d", "linear_layout"]


def is_conv1d(module: Any) -> bool:
    """Whether ``module`` stores its weight as transformers' ``Conv1D`` does (GPT-2's projections), read
    from its attributes, not its class name: a 2-D weight ``[nx, nf]`` (inputs, outputs), the
    transpose of ``nn.Linear``'s ``[out, in]``."""
    nf = getattr(module, "nf", None)
    if isinstance(module, torch.nn.Linear) or not isinstance(nf, int):  # the weight is read only past this
        return False
    w, nx = getattr(module, "weight", None), getattr(module, "nx", None)
    return (
        isinstance(w, torch.Tensor)
        and w.dim() == 2
        and tuple(w.shape) == (nx if isinstance(nx, int) else w.shape[0], nf)
    )


def linear_layout(module: Any, weight: Tensor | None = None) -> Tensor:
    """``module``'s 2-D weight (or ``weight``, one stored as the module stores its own) in ``nn.Linear``'s
    layout ``[out, in]``: a transposed view where the module is a ``Conv1D`` (:func:`is_conv1d`), the
    weight itself otherwise (no copy either way, so in-place writes reach the module)."""
    w = module.weight if weight is None else weight
    return w.T if is_conv1d(module) else w
