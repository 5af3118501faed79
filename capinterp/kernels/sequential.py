"""Sequential integrated gradients on FFN neurons (Enguehard 2023, Sec. 3; used by Chen et al. 2025, arXiv 2405.14117).

Plain IG (:mod:`capinterp.kernels.ig`) scales one layer's activations at the scored positions
jointly. SIG scales **one token position at a time**: for layer ``l`` and each scaled position ``t``, only ``hook_post[l][t]`` (all neurons at t) moves along ``b + alpha_k (a_t - b)``
while every other position keeps its clean activation, and

    SIG_l = sum_t (a_t - b) * sum_k w_k dF/da_t(alpha_k)                      -> [d_mlp]

with F the probability (or log-probability) of the first answer token at the last prompt
position, as in KN, and (alpha_k, w_k) any rule of :mod:`capinterp.kernels.quadrature` (the papers'
right sum: w_k = 1/m). Rows = (layer, position, step) triples, ``batch_size`` per forward and
backward, unembedded at the last prompt position only; the model's parameters get no ``.grad``.
Sums in float64; returned float32 on the CPU.

Routes (``config.route``): ``"fast"`` runs only what a row changes, with the IG kernel's staircase
(:mod:`capinterp.kernels.prefix`): for a row scaled at position ``t`` the tokens before ``t``
are clean (one KV cache per ``t``, computed once), and a row scaled at layer ``l`` enters at
block ``l`` with the recorded clean residual, so rows of several layers share one batch; it
falls back to ``"loop"`` (a full forward per row, one layer per batch) where the model gives
no KV cache or direct block calls do not reproduce its logits.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable

import torch

from capinterp.arch.forward import capture, unembed
from capinterp.arch.model import neuron_hook, neuron_shape
from capinterp.core.protocol import Model
from capinterp.core.tokens import Encoded
from capinterp.kernels import prefix as _prefix
from capinterp.kernels.completeness import completeness_error, new_stats
from capinterp.kernels.ig import frozen_params, objective_from_logits
from capinterp.kernels.ig_config import IGConfig
from capinterp.kernels.quadrature import RULES, quadrature

__all__ = ["DEFAULT", "POSITIONS", "ROUTES", "RULES", "check_config", "sig_scores"]

#: The routes and position sets :func:`sig_scores` takes.
ROUTES = ("fast", "loop")
POSITIONS = ("prompt", "last_prompt")
#: SIG's default settings: the papers' rule over every prompt token (invariance has no use here).
DEFAULT = IGConfig(positions="prompt", invariance="off")


def check_config(config: IGConfig) -> IGConfig:
    """``config``, or a TypeError / ValueError when :func:`sig_scores` cannot run it (no adaptive
    rule, no closed form, routes ``"fast"`` / ``"loop"``, positions ``"prompt"`` / ``"last_prompt"``)."""
    if not isinstance(config, IGConfig):
        raise TypeError(f"config must be an IGConfig, got {type(config).__name__}")
    if config.rule not in RULES:
        raise ValueError(f"SIG has no adaptive rule: rule must be one of {', '.join(RULES)}, got {config.rule!r}")
    if config.route not in ROUTES:
        raise ValueError(f"unknown route {config.route!r} for SIG; choose one of {', '.join(ROUTES)}")
    if config.positions not in POSITIONS:
        raise ValueError(f"unknown positions {config.positions!r} for SIG; choose one of {', '.join(POSITIONS)}")
    if config.invariance != "off":  # its path scales one token at a time: no closed form
        raise ValueError(f"SIG integrates node by node: invariance must be 'off', got {config.invariance!r}")
    return config


def sig_scores(
    model: Model,
    enc: Encoded,
    config: IGConfig = DEFAULT,
    *,
    at: Iterable[int] | None = None,
    baseline: torch.Tensor | None = None,
    layers: Iterable[int] | None = None,
    stats: dict | None = None,
) -> torch.Tensor:
    """SIG of every neuron for one prompt: float32 ``[n_layers, d_mlp]``.

    Completeness: summed over the scaled positions, layer ``l``'s scores should equal
    ``sum_t (F(x) - F(x with a_t = b))``; one extra row per (layer, position) (alpha = 0, weight 0)
    gives those values. ``stats`` (a dict), when given, receives the records of
    :data:`capinterp.kernels.completeness.STAT_KEYS` for this one example ([1, n_layers]), with
    ``f_base`` the effective baseline value ``F(x) - sum_t (F(x) - F(x with a_t = b))``.

    The token positions scaled one at a time: ``at`` when given, else ``config.positions``:
    ``"prompt"`` (every prompt position after the BOS, the last prompt token included) or
    ``"last_prompt"`` (that token only: then SIG equals KN's IG). ``baseline``: None (0) or
    ``[n_layers, d_mlp]``. ``config.route``: ``"fast"`` or ``"loop"`` (module docstring; same
    scores to float32 noise); ``config`` (:class:`~capinterp.kernels.ig_config.IGConfig`) also
    gives ``steps``, ``rule``, ``objective`` and ``batch_size`` (see :func:`check_config`).
    """
    check_config(config)
    steps, rule, objective, batch_size = config.steps, config.rule, config.objective, config.batch_size
    n_layers, d_mlp = neuron_shape(model)
    dev = torch.device(model.cfg.device)
    last = enc.last_prompt_pos
    if at is None and config.positions == "last_prompt":
        at = [last]
    elif at is None:
        first = (
            1 if len(enc.prompt_ids) > 1 and enc.prompt_ids[0] == getattr(model.tokenizer, "bos_token_id", None) else 0
        )
        at = range(first, last + 1)
    pos = sorted(set(int(p) for p in at))
    if not pos or pos[0] < 0 or pos[-1] > last:
        raise ValueError(f"positions must lie in [0, {last}] (the prompt), got {pos}")
    lay = list(range(n_layers)) if layers is None else sorted(set(int(l) for l in layers))
    if baseline is not None and tuple(baseline.shape) != (n_layers, d_mlp):
        raise ValueError(f"baseline must be [n_layers, d_mlp]=({n_layers}, {d_mlp}), got {tuple(baseline.shape)}")
    alphas, weights = quadrature(steps, rule)  # float64 nodes and weights
    n_rule = len(alphas)
    if not bool((alphas == 0).any()):  # a baseline row per (layer, position): completeness
        alphas, weights = torch.cat([alphas, alphas.new_zeros(1)]), torch.cat([weights, weights.new_zeros(1)])
    k0 = int((alphas == 0).nonzero()[0, 0])
    alphas, weights = alphas.to(dev), weights.to(dev)
    tokens = torch.tensor([enc.ids[: last + 1]], device=dev)
    target = torch.tensor([enc.target_ids[0]], device=dev)
    base = (
        torch.zeros(n_layers, d_mlp, device=dev, dtype=torch.float64) if baseline is None else baseline.to(dev).double()
    )
    fv = {l: torch.zeros(len(pos), len(alphas), dtype=torch.float64) for l in lay}  # F per (position, node)
    fc: list[float] = []
    args = (model, tokens, pos, lay, alphas, weights, base, target, objective, batch_size, fv, fc)
    with frozen_params(model), torch.enable_grad():
        scores = _fast(*args) if config.route == "fast" else None
        if scores is None:
            fc.clear()
            scores = _loop(*args)
    if stats is not None:
        rec = new_stats(1, n_layers)
        rec["f_clean"][0] = fc[0]
        for l in lay:
            change = float((fc[0] - fv[l][:, k0]).sum())
            total = float(scores[l].double().sum())
            rec["f_base"][0, l], rec["attr_sum"][0, l] = fc[0] - change, total
            rec["completeness"][0, l] = completeness_error(total, fc[0], fc[0] - change)
            rec["nodes"][0, l] = n_rule
            rec["attr_l1"][0, l] = float(scores[l].double().abs().sum())
        stats.update(rec)
    return scores


def _finish(out: torch.Tensor, acts: dict[int, torch.Tensor], gsum: dict[int, torch.Tensor], base):
    """``out[l] = sum_t (a_t - b) * gsum_t``, gsum already weighted by the rule."""
    for l, g in gsum.items():
        out[l] = ((acts[l] - base[l]) * g).sum(0).float().cpu()
    return out


def _fast(
    model: Model, tokens, pos, lay, alphas, weights, base, target, objective, batch_size, fv, fc
) -> torch.Tensor | None:
    """Staircase route, one clean run per scaled position t split at t (the tokens before t never
    change); rows of every layer enter at their own block. None where the model cannot take it."""
    last = tokens.shape[1] - 1
    n_layers, d_mlp = neuron_shape(model)
    acts = {l: torch.zeros(len(pos), d_mlp, device=tokens.device, dtype=torch.float64) for l in lay}
    gsum = {l: torch.zeros(len(pos), d_mlp, device=tokens.device, dtype=torch.float64) for l in lay}
    for ti, t in enumerate(pos):
        try:
            with torch.no_grad():
                run = _prefix.clean_suffix(model, tokens[0], t)
        except _prefix.NoCache as err:
            warnings.warn(
                f"the prompt prefix is not reused ({err}); SIG uses route='loop'", RuntimeWarning, stacklevel=3
            )
            return None
        if ti == 0 and not _prefix.stair_supported(model, run):
            warnings.warn(
                "direct block calls do not reproduce this model's logits; SIG uses route='loop'",
                RuntimeWarning,
                stacklevel=3,
            )
            return None
        if ti == 0:
            fc.append(float(objective_from_logits(run.logits[None, last - t : last - t + 1], target, objective)[0]))
        for l in lay:
            acts[l][ti] = run.acts[l][0].double()  # position t is the suffix's first
        mine = [(l, k) for l in lay for k in range(len(alphas))]  # this position's rows, layer-major
        for c0 in range(0, len(mine), batch_size):
            chunk = mine[c0 : c0 + batch_size]
            groups, row_weights, row_nodes = [], [], []
            for l in sorted({l for l, _ in chunk}):
                ks = [k for lj, k in chunk if lj == l]
                al = alphas[ks]
                row_weights.append(weights[ks])
                row_nodes.append(ks)
                z = run.acts[l][None].repeat(len(al), 1, 1)  # [c, S, d_mlp]: clean, except ...
                z[:, 0] = (base[l] + al[:, None] * (acts[l][ti] - base[l])).to(z.dtype)  # ... at t
                groups.append((l, z.requires_grad_(True)))
            logits = _prefix.stair_logits(model, run, groups, at=last - t)
            F = objective_from_logits(logits, target, objective)
            grads = torch.autograd.grad(F.sum(), [z for _, z in groups])
            Fd, r = F.detach().double().cpu(), 0
            for (l, _), g, w, ks in zip(groups, grads, row_weights, row_nodes):
                gsum[l][ti] += w @ g[:, 0].double()
                fv[l][ti, ks] = Fd[r : r + len(ks)]
                r += len(ks)
    return _finish(torch.zeros(n_layers, d_mlp), acts, gsum, base)


def _loop(model: Model, tokens, pos, lay, alphas, weights, base, target, objective, batch_size, fv, fc) -> torch.Tensor:
    """Full forward per row, from the first block; rows of one layer per batch."""
    n_layers, d_mlp = neuron_shape(model)
    dev, last = tokens.device, tokens.shape[1] - 1
    clean: dict[int, torch.Tensor] = {}

    def grab(act, hook):
        clean[int(hook.name.split(".")[1])] = act[0].detach()

    with torch.no_grad():
        logits = model.run_with_hooks(tokens, fwd_hooks=[(neuron_hook(l), grab) for l in lay])
    fc.append(float(objective_from_logits(logits[:, last : last + 1], target, objective)[0]))
    acts = {l: clean[l].double()[pos] for l in lay}
    gsum = {l: torch.zeros(len(pos), d_mlp, device=dev, dtype=torch.float64) for l in lay}
    pos_t = torch.tensor(pos, device=dev)
    for l in lay:
        mine = [(t, k) for t in range(len(pos)) for k in range(len(alphas))]  # this layer's rows
        for c0 in range(0, len(mine), batch_size):
            tk = mine[c0 : c0 + batch_size]
            ti = torch.tensor([t for t, _ in tk], device=dev)
            ks = [k for _, k in tk]
            ra = alphas[ks]
            z = (
                (base[l] + ra[:, None] * (acts[l][ti] - base[l])).to(clean[l].dtype).detach().requires_grad_(True)
            )  # [R, d_mlp]
            onehot = torch.nn.functional.one_hot(pos_t[ti], clean[l].shape[0]).bool()[:, :, None]  # [R, T, 1]

            def put(act, hook, z=z, onehot=onehot):
                return torch.where(onehot, z[:, None, :].to(act.dtype), act)

            resid = capture(model, tokens.expand(len(tk), -1), "ln_final.hook_in", [(neuron_hook(l), put)])
            F = objective_from_logits(unembed(model, resid[:, last : last + 1]), target, objective)
            (g,) = torch.autograd.grad(F.sum(), z)
            gsum[l].index_add_(0, ti, g.double() * weights[ks][:, None])
            fv[l][ti.cpu(), ks] = F.detach().double().cpu()
    return _finish(torch.zeros(n_layers, d_mlp), acts, gsum, base)
