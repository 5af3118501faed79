"""Reading weights that accelerate keeps offloaded (``device_map`` with ``"cpu"`` / ``"disk"``).

An offloaded module's parameters sit on the meta device between calls, and accelerate's hook
brings them in only around its forward. Methods that read weights directly (DCSN's
``W_out @ W_U``) enter :func:`weights_readable` around the read; it does nothing for a model
placed whole on one device, so the common path pays only a walk over a few modules.
"""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Iterator

import torch

__all__ = ["weights_readable"]


@contextlib.contextmanager
def weights_readable(*modules: torch.nn.Module) -> Iterator[None]:
    """Within the block, every offloaded parameter under ``modules`` holds its values on the
    module's execution device (accelerate's hook puts them back on exit). Read-only: a write
    made inside is lost when the block ends."""
    if importlib.util.find_spec("accelerate") is None:
        yield
        return
    from accelerate.utils import align_module_device, has_offloaded_params

    with contextlib.ExitStack() as stack:
        for module in modules:
            for m in module.modules():
                if has_offloaded_params(m):
                    stack.enter_context(align_module_device(m))
        yield
