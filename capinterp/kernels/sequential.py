"""Sequential integrated gradients on FFN neurons (Enguehard 2023, Sec. 3; used by Chen et al. 2025, papers/004).

Plain IG (:mod:`capinterp.kernels.ig`) scales one layer's activations at the scored positions
jointly. SIG scales **one token position at a time**: for layer ``l`` and each position ``t`` of
``positions``, only ``hook_post[l][t]`` (all neurons at t) moves along ``b + alpha_k (a_t - b)``
while every other position keeps its clean activation, and

    SIG_l = sum_t (a_t - b) * (1/m) sum_k dF/da_t(alpha_k)                    -> [d_mlp]

with F the probability (or log-probability) of the first answer token at the last prompt
position, as in KN. Rows = (position, step) pairs of one layer, ``batch_size`` per forward and
backward, unembedded at the last prompt position only; the model's parameters get no ``.grad``.
Returned float32 on the CPU.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from capinterp.core.forward import capture, unembed
from capinterp.core.model import neuron_hook, neuron_shape
from capinterp.core.tokens import Encoded
from capinterp.kernels.ig import frozen_params, ig_alphas, objective_from_logits

__all__ = ["RULES", "sig_scores"]

RULES = ("right", "left", "linspace")


def sig_scores(
    model,
    enc: Encoded,
    *,
    steps: int = 20,
    rule: str = "right",
    objective: str = "prob",
    positions: Iterable[int] | None = None,
    baseline: torch.Tensor | None = None,
    layers: Iterable[int] | None = None,
    batch_size: int = 64,
) -> torch.Tensor:
    """SIG of every neuron for one prompt: float32 ``[n_layers, d_mlp]``.

    ``positions``: the token positions scaled one at a time (default: every prompt position after
    the BOS, the last prompt token included). ``baseline``: None (0) or ``[n_layers, d_mlp]``.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if rule not in RULES:  # equal-weight rules only: every point is weighted 1/m below
        raise ValueError(f"rule must be one of {RULES}, got {rule!r}")
    n_layers, d_mlp = neuron_shape(model)
    dev = torch.device(model.cfg.device)
    last = enc.last_prompt_pos
    if positions is None:
        first = (
            1 if len(enc.prompt_ids) > 1 and enc.prompt_ids[0] == getattr(model.tokenizer, "bos_token_id", None) else 0
        )
        positions = range(first, last + 1)
    pos = sorted(set(int(p) for p in positions))
    if not pos or pos[0] < 0 or pos[-1] > last:
        raise ValueError(f"positions must lie in [0, {last}] (the prompt), got {pos}")
    lay = list(range(n_layers)) if layers is None else sorted(set(int(l) for l in layers))
    if baseline is not None and tuple(baseline.shape) != (n_layers, d_mlp):
        raise ValueError(f"baseline must be [n_layers, d_mlp]=({n_layers}, {d_mlp}), got {tuple(baseline.shape)}")
    alphas = ig_alphas(steps, rule)
    tokens = torch.tensor([enc.ids[: last + 1]], device=dev)
    target = torch.tensor([enc.target_ids[0]], device=dev)
    clean: dict[int, torch.Tensor] = {}

    def grab(act, hook):
        clean[int(hook.name.split(".")[1])] = act[0].detach()

    with torch.no_grad():
        model.run_with_hooks(tokens, fwd_hooks=[(neuron_hook(l), grab) for l in lay])
    # rows: every (position, alpha) pair
    row_pos = torch.tensor(pos, device=dev).repeat_interleave(len(alphas))
    row_alpha = alphas.to(dev).repeat(len(pos))
    out = torch.zeros(n_layers, d_mlp)
    with frozen_params(model), torch.enable_grad():
        for l in lay:
            a = clean[l].float()  # [T, d_mlp]
            b = torch.zeros(d_mlp, device=dev) if baseline is None else baseline[l].to(dev).float()
            gsum = torch.zeros(len(pos), d_mlp, device=dev)
            for c0 in range(0, len(row_pos), batch_size):
                rp, ra = row_pos[c0 : c0 + batch_size], row_alpha[c0 : c0 + batch_size]
                z = (b + ra[:, None] * (a[rp] - b)).detach().requires_grad_(True)  # [R, d_mlp]
                onehot = torch.nn.functional.one_hot(rp, a.shape[0]).bool()[:, :, None]  # [R, T, 1]

                def put(act, hook, z=z, onehot=onehot):
                    return torch.where(onehot, z[:, None, :].to(act.dtype), act)

                resid = capture(model, tokens.expand(len(rp), -1), "ln_final.hook_in", [(neuron_hook(l), put)])
                F = objective_from_logits(unembed(model, resid[:, last : last + 1]), target, objective)
                (g,) = torch.autograd.grad(F.sum(), z)
                gsum.index_add_(0, (c0 + torch.arange(len(rp), device=dev)) // len(alphas), g.float())
            out[l] = ((a[pos] - b) * gsum / len(alphas)).sum(0).cpu()
    return out
