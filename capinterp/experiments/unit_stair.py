"""Exact single-unit effects of FFN neurons and layers without recomputing the layers below them.

Patching neurons of layer ``l`` (their ``hook_post`` set to a reference at every position) leaves
every layer below ``l`` equal to the clean run. Per example, the clean run is recorded once
(:func:`capinterp.kernels.prefix.clean_suffix`), and each patched copy joins at block ``l`` from
the recorded residual with layer ``l``'s activations replaced
(:func:`capinterp.kernels.prefix.stair_logits`, rows folded into the sequence); logits are computed
at the answer position only. Equal to
:func:`capinterp.interventions.faithfulness.ablated_metric`'s full forward per row (checked in the
tests); :func:`stair_effects` returns None where direct block calls do not reproduce the model's own
logits (:func:`~capinterp.kernels.prefix.stair_supported`), and the caller takes that route.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from capinterp.arch.model import neuron_hook
from capinterp.circuits.eap import Pair
from capinterp.core.protocol import Model
from capinterp.core.tokens import Encoded
from capinterp.kernels import prefix as px

__all__ = ["MAX_ROWS", "stair_effects"]

#: patched copies of one prompt per block call (the folded mask grows with the square of rows)
MAX_ROWS = 32


def _single_layer(groups: list[torch.Tensor]) -> list[int]:
    """Each group's layer; ValueError for a group spanning several layers or none."""
    layers = []
    for g in groups:
        rows = g.any(1).nonzero().flatten().tolist()
        if len(rows) != 1:
            raise ValueError(f"a stair group must lie in one layer, got layers {rows}")
        layers.append(rows[0])
    return layers


def _calls(layers: list[int]) -> list[list[int]]:
    """Group indices in calls of at most :data:`MAX_ROWS` rows, layers non-decreasing within a call."""
    order = sorted(range(len(layers)), key=lambda i: layers[i])
    return [order[s : s + MAX_ROWS] for s in range(0, len(order), MAX_ROWS)]


@torch.no_grad()
def _reference(model: Model, pair: Pair | None, S: int, L: int) -> Any:
    """``[L, S, d]`` corrupted ``hook_post`` activations at the prompt positions, or 0 (zero)."""
    if pair is None:
        return 0.0
    dev = next(model.parameters()).device
    _, cache = model.run_with_cache(
        torch.tensor([pair.corrupt_ids[:S]], device=dev), names_filter=lambda n: n.endswith("mlp.hook_post")
    )
    return torch.stack([cache[neuron_hook(l)][0] for l in range(L)])


@torch.no_grad()
def stair_effects(
    model: Model, items: list[Encoded], groups: list[torch.Tensor], pairs: list[Pair] | None = None
) -> np.ndarray | None:
    """``[len(groups)]`` mean of p(target | clean) - p(target | group patched), each group a bool
    ``[n_layers, d_mlp]`` mask within one layer, patched to 0 or (``pairs``) the corrupted prompt's
    activations; None where the stair does not reproduce this model's logits."""
    layers = _single_layer(groups)
    total = np.zeros(len(groups))
    for n, it in enumerate(items):
        S, target = len(it.prompt_ids), it.target_ids[0]
        run = px.clean_suffix(model, torch.tensor(it.prompt_ids), 0)
        if n == 0 and not px.stair_supported(model, run):
            return None
        clean = float(run.logits[-1].float().softmax(-1)[target])
        ref = _reference(model, None if pairs is None else pairs[n], S, len(run.acts))
        for call in _calls(layers):
            chunk = []
            for l in sorted({layers[i] for i in call}):
                rows = [i for i in call if layers[i] == l]
                z = run.acts[l][None].repeat(len(rows), 1, 1)
                for r, i in enumerate(rows):
                    mask = groups[i][l].to(z.device)
                    z[r][:, mask] = 0.0 if pairs is None else ref[l][:, mask].to(z.dtype)
                chunk.append((l, z, rows))
            logits = px.stair_logits(model, run, [(l, z) for l, z, _ in chunk], at=S - 1)
            p = logits[:, 0].float().softmax(-1)[:, target].double().cpu().numpy()
            order = [i for _, _, rows in chunk for i in rows]
            total[order] += clean - p
    return total / len(items)
