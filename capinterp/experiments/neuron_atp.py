"""Attribution patching (AtP) of FFN neurons against a zero or a corrupted-prompt reference.

``atp(u) = mean_x sum_t (a_u(x, t) - ref_u(x, t)) * dm/da_u(x, t)``, with ``m`` the probability of the
target's first token at the last prompt position and ``a_u`` the neuron's ``hook_post`` activation:
the first-order estimate of ``m(clean) - m(u patched to ref at every position)`` (Nanda 2023;
Kramar et al. 2024, "AtP*", arXiv:2403.00745). ``ref`` is 0 (zero ablation) or the activation on the
example's corrupted prompt (:class:`~capinterp.circuits.eap.Pair`). One forward and one backward
pass per batch give every neuron.
"""

from __future__ import annotations

from typing import Any

import torch

from capinterp.arch.forward import logits_at
from capinterp.arch.model import neuron_hook, neuron_shape
from capinterp.circuits.eap import Pair
from capinterp.core import validate
from capinterp.core.protocol import Model
from capinterp.core.tokens import Encoded, encode, pad_id, pad_right

__all__ = ["neuron_atp"]


def neuron_atp(model: Model, data: Any, *, batch_size: int = 16) -> torch.Tensor:
    """``[n_layers, d_mlp]`` float64 AtP scores; ``data``: examples (zero reference) or Pairs (corrupted)."""
    bs = validate.positive_int("batch_size", batch_size)
    if not data:
        raise ValueError("neuron_atp needs at least one example")
    pairs = list(data) if isinstance(data[0], Pair) else None
    items: list[Encoded] = (
        [p.clean for p in pairs] if pairs else encode(model, validate.examples(data, need_target=True))
    )
    L, d = neuron_shape(model)
    dev = next(model.parameters()).device
    total = torch.zeros(L, d, dtype=torch.float64)
    pad = pad_id(model.tokenizer)
    for s in range(0, len(items), bs):
        chunk = items[s : s + bs]
        tokens = pad_right([it.ids for it in chunk], pad)[0].to(dev)
        ref: list[Any] = [0.0] * L
        if pairs:
            bad = pad_right([p.corrupt_ids for p in pairs[s : s + bs]], pad)[0].to(dev)
            with torch.no_grad():
                _, cache = model.run_with_cache(bad, names_filter=lambda n: n.endswith("mlp.hook_post"))
            ref = [cache[neuron_hook(l)].float() for l in range(L)]
        leaves: list[torch.Tensor] = []

        def leaf(act: torch.Tensor, hook: Any) -> torch.Tensor:
            x = act.detach().requires_grad_(True)
            leaves.append(x)
            return x

        last = torch.tensor([it.last_prompt_pos for it in chunk], device=dev)
        target = torch.tensor([it.target_ids[0] for it in chunk], device=dev)
        with torch.enable_grad():
            logits = logits_at(model, tokens, last, fwd_hooks=[(neuron_hook(l), leaf) for l in range(L)])
            metric = logits.softmax(-1)[torch.arange(len(chunk), device=dev), target].sum()
            grads = torch.autograd.grad(metric, leaves, allow_unused=True)
        for l, (a, g) in enumerate(zip(leaves, grads)):
            if g is not None:
                total[l, : a.shape[-1]] += ((a.detach().float() - ref[l]) * g.float()).sum((0, 1)).double().cpu()
    return total / len(items)
