"""Integrated gradients and gradient x activation on FFN neurons (``blocks.{l}.mlp.hook_post``).

The IG kernel of Dai et al. 2022 (Sec. 3.2) and Huang et al. 2025 (Eq. 7), for one example and layer ``l``:

* ``a`` = ``hook_post`` of layer ``l`` at the scaled positions ``P``, baseline ``b`` (0 or given);
* for ``k = 1..m`` the whole activation vector of layer ``l`` at ``P`` (all neurons jointly) is
  replaced by ``b + alpha_k (a - b)``; other layers run normally (downstream is recomputed);
  the nodes ``alpha_k`` and weights ``w_k`` come from a quadrature rule
  (:mod:`capinterp.kernels.quadrature`): ``"right"`` (k/m, weights 1/m: the papers' rule),
  ``"left"``, ``"midpoint"``, ``"trapezoid"``, ``"linspace"`` or ``"gauss"`` (Gauss-Legendre);
* ``F`` = mean over the answer tokens ``y_j`` of ``p(y_j | x + y_<j)`` (``objective="logprob"``:
  of ``log p``), teacher-forced with the gold target tokens;
* ``IG_l = (a - b) * sum_k w_k dF/da(alpha_k)``, summed over ``P`` -> ``[d_mlp]``.

``positions="answer"`` scales every answer-predicting position ``|x|-1 .. |x|+|y|-2`` (CNL);
``"last_prompt"`` scales ``|x|-1`` and reads the first target token only (KN).

Routes (``config.route``; same numbers, different cost; see ``benchmarks/bench_ig.py``):

* ``"loop"``: the straightforward route. Per layer, the ``m`` points are a batch of ``m`` full
  sequences; full forward and backward over the whole sequence.
* ``"fast"``: rows = (layer, step) pairs of all requested layers, chunked by ``batch_size``.
  The clean prefix (positions before ``P``) runs once and its KV cache is shared; only the
  positions ``P`` run per row, and a row scaled at layer ``l`` enters at block ``l`` with the
  clean residual (the layers below it are never recomputed: a layer staircase). Logits are
  computed at ``P`` only. One backward per chunk; rows are independent, so each row's
  gradient is exact. A node at ``alpha = 1`` (the right rule's last, the closed form's first)
  is the clean point for every layer: one clean row with a zero leaf added to every layer's
  ``hook_post`` gives its gradient for all layers at once (``n_layers x (m - 1) + 1`` rows).
  Details in :mod:`capinterp.kernels.prefix`.
* ``"prefix"``: the prefix reuse and layer batching of ``"fast"``, but every row runs every
  block through the bridge's own forward. ``"fast"`` falls back to it (with a warning) when
  direct block calls do not reproduce the model's logits on an architecture (checked on the
  first example of each call); both fall back to ``"loop"`` for models without an HF KV cache.

Scale-invariant FFN outputs (Gemma 2/3's post-FFN RMSNorm): with a zero baseline the rule's
sum is read off four nodes whatever ``steps``: three rows per layer plus the shared clean row
(``config.invariance="auto"``, the default; same scores to float32 noise, checked per example, see
:mod:`capinterp.kernels.invariant`).

Completeness, always: every rule gets one more node, alpha = 0 with weight 0 (the baseline; a
rule with its own node there uses it), so ``F(baseline)`` per layer comes from the same batches
and ``F(x)`` from the clean run; ``stats`` receives the per-layer completeness error
(:mod:`capinterp.kernels.completeness`). ``config.rule="adaptive"`` refines the rule per layer (graded
towards alpha = 0 where a zero baseline makes the integrand sharp there, Gauss-Legendre doubled
elsewhere) until an error estimate is below ``tol``, one batched call per round with only the
unconverged layers (:mod:`capinterp.kernels.adaptive`).

Otherwise every rule costs the same per point: ``n_layers x m`` rows per example (one fewer per
layer, plus one, with a node at alpha = 1), so the cost is linear in
``steps`` whatever the rule (Gauss-Legendre with 10 points = half the papers' 20 rows;
errors per rule in ``benchmarks/bench_ig.py --rules``). "loop" runs every row over the whole
sequence whatever the answer length; "fast" runs the answer positions only, and the unembedding
(which softmax needs in full) is a large share of its cost. Float32 agreement between routes is
limited by float32 itself: measured against float64 by ``benchmarks/bench_ig.py --fp64-check``,
see docs/results.md ("The integrated-gradients kernel").

Other hooks on the model are not supported during a "fast"/"prefix" call: they would see
suffix-only (and, for "fast", row-folded) tensors. A warning says so when any are attached.

Parameters never get ``.grad`` (their ``requires_grad`` is switched off during the call and
restored), hooks are removed on exit, and gradients accumulate in float32. Computation runs
on ``model.cfg.device``; the returned scores are float32 on the CPU.
"""

from __future__ import annotations

import contextlib
import math
import warnings
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch
from einops import rearrange, repeat
from jaxtyping import Float, Int

from capinterp.arch.model import neuron_hook, neuron_shape, user_hooks
from capinterp.core.protocol import Model
from capinterp.core.tokens import Encoded
from capinterp.kernels import prefix as _prefix
from capinterp.kernels.adaptive import adaptive_ig
from capinterp.kernels.completeness import CompletenessWarning, completeness_error, new_stats
from capinterp.kernels.ig_config import CLOSED_FORM, INVARIANCE, OBJECTIVES, IGConfig
from capinterp.kernels.invariant import N_NODES, check_tolerance, scale_invariant, substitute_nodes
from capinterp.kernels.prefix_state import unshared_state
from capinterp.kernels.quadrature import quadrature

__all__ = [
    "INVARIANCE",
    "OBJECTIVES",
    "POSITIONS",
    "ROUTES",
    "SHARE_CLEAN_ROW",
    "Site",
    "check_config",
    "frozen_params",
    "grad_x_act",
    "ig_alphas",
    "ig_scores",
    "objective_from_logits",
    "site",
]

#: The scaled positions and routes :func:`ig_scores` takes (of :data:`capinterp.kernels.ig_config.POSITIONS`
#: and :data:`~capinterp.kernels.ig_config.ROUTES`).
POSITIONS = ("answer", "last_prompt")
ROUTES = ("fast", "prefix", "loop")


def ig_alphas(steps: int, rule: str = "right") -> Float[torch.Tensor, " m"]:
    """The ``m`` interpolation coefficients of a rule (float64, CPU); weights: :func:`quadrature`."""
    return quadrature(steps, rule)[0]


@dataclass(frozen=True)
class Site:
    """Where IG scales and reads one example.

    ``seq`` holds exactly the tokens needed (the last target token predicts nothing and is
    dropped). The scaled positions are ``p0 .. len(seq)-1`` and ``targets[j]`` is read at
    ``p0 + j``: every scaled position is read and vice versa.
    """

    seq: torch.Tensor  # [T] long
    p0: int
    targets: torch.Tensor  # [S] long

    @property
    def n_pos(self) -> int:
        return int(self.targets.numel())


def site(enc: Encoded, positions: str = "answer") -> Site:
    if positions not in POSITIONS:
        raise ValueError(f"positions must be one of {POSITIONS}, got {positions!r}")
    if not enc.target_ids or not enc.prompt_ids:
        raise ValueError("an example needs prompt and target tokens")
    targets = list(enc.target_ids) if positions == "answer" else [enc.target_ids[0]]
    seq = list(enc.prompt_ids) + targets[:-1]
    return Site(torch.tensor(seq, dtype=torch.long), len(enc.prompt_ids) - 1, torch.tensor(targets))


def _upcast(t: torch.Tensor) -> torch.Tensor:
    return t if t.dtype in (torch.float32, torch.float64) else t.float()


def objective_from_logits(
    logits: Float[torch.Tensor, "rows S V"], targets: Int[torch.Tensor, " S"], objective: str = "prob"
) -> Float[torch.Tensor, " rows"]:
    """F per row: logits [R, S, V] at the read positions, targets [S] -> [R] (float32 at least).

    Written with ``logsumexp``, not ``softmax``: torch's CPU softmax uses a fast approximate exp
    whose error, summed over the vocabulary in the unembedding's backward, shows in float32 IG
    scores against float64 (``benchmarks/bench_ig.py --fp64-check``).
    """
    lg = _upcast(logits)
    idx = repeat(targets.to(lg.device), "s -> r s 1", r=lg.shape[0])
    logp = lg.gather(-1, idx).squeeze(-1) - torch.logsumexp(lg, dim=-1)
    return (logp.exp() if objective == "prob" else logp).mean(-1)


class _Objective(torch.autograd.Function):
    """:func:`objective_from_logits` with a fused backward: (1/S) c (onehot(y) - exp(z - lse)),
    c = p(y) ("prob") or 1 ("logprob"), built in place in one buffer. Same operations as autograd's
    (bitwise equal in float64), half the passes over the [rows, S, V] logits."""

    @staticmethod
    def forward(ctx, logits, targets, logprob: bool):
        lg = _upcast(logits)
        idx = repeat(targets.to(lg.device), "s -> r s 1", r=lg.shape[0])
        lse = torch.logsumexp(lg, dim=-1, keepdim=True)
        logp = lg.gather(-1, idx) - lse
        val = logp if logprob else logp.exp()
        ctx.save_for_backward(lg, lse, idx, torch.ones_like(val) if logprob else val)
        ctx.in_dtype = logits.dtype
        return val.squeeze(-1).mean(-1)

    @staticmethod
    def backward(ctx, grad_out):
        lg, lse, idx, c = ctx.saved_tensors
        coef = rearrange(grad_out, "r -> r 1 1") * c / idx.shape[1]
        grad = torch.sub(lg, lse).exp_().mul_(-coef).scatter_add_(-1, idx, coef)
        return grad.to(ctx.in_dtype), None, None


@contextlib.contextmanager
def frozen_params(model: Model):
    """Switch ``requires_grad`` off on every parameter for the duration; restore it after."""
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p in params:
            p.requires_grad_(True)


def _check(positions: str, objective: str) -> None:
    if positions not in POSITIONS:
        raise ValueError(f"positions must be one of {POSITIONS}, got {positions!r}")
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {OBJECTIVES}, got {objective!r}")


def check_config(config: IGConfig) -> IGConfig:
    """``config``, or a TypeError / ValueError when :func:`ig_scores` cannot run it (a position
    set of another kernel: ``"prompt"`` is :func:`capinterp.kernels.sequential.sig_scores`')."""
    if not isinstance(config, IGConfig):
        raise TypeError(f"config must be an IGConfig, got {type(config).__name__}")
    if config.positions not in POSITIONS:
        raise ValueError(f"unknown positions {config.positions!r} for IG; choose one of {', '.join(POSITIONS)}")
    return config


def _items(encoded: Encoded | Sequence[Encoded]) -> list[Encoded]:
    items = [encoded] if isinstance(encoded, Encoded) else list(encoded)
    for i, it in enumerate(items):
        if not isinstance(it, Encoded):
            raise TypeError(f"item {i} is {type(it).__name__}; pass capinterp.core.tokens.encode(...) output")
    return items


def _layers(layers: Iterable[int] | None, n_layers: int) -> list[int]:
    if layers is None:
        return list(range(n_layers))
    out = sorted({int(l) + n_layers if int(l) < 0 else int(l) for l in layers})
    if not out or out[0] < 0 or out[-1] >= n_layers:
        raise ValueError(f"layers must be a non-empty subset of 0..{n_layers - 1}, got {layers}")
    return out


def _baseline(baseline, n_layers: int, d_mlp: int, device) -> torch.Tensor | None:
    """None, or float32 [n_layers, d_mlp] (a [d_mlp] vector is used for every layer)."""
    if baseline is None:
        return None
    b = torch.as_tensor(baseline, dtype=torch.float32, device=device)
    if b.shape == (d_mlp,):
        b = b.expand(n_layers, d_mlp)
    if b.shape != (n_layers, d_mlp):
        raise ValueError(f"baseline must have shape [d_mlp]={d_mlp} or [n_layers, d_mlp]=({n_layers}, {d_mlp})")
    return b


def _points(act: torch.Tensor, base: torch.Tensor | None, alphas: torch.Tensor, dtype) -> torch.Tensor:
    """Leaf [c, S, d_mlp]: ``b + alpha (a - b)`` for each alpha, requiring grad."""
    a = _upcast(act)
    al = rearrange(alphas.to(device=a.device, dtype=a.dtype), "c -> c 1 1")
    z = al * a if base is None else base.to(a.dtype) + al * (a - base.to(a.dtype))
    return z.to(dtype).detach().requires_grad_(True)


def _finish(acts: torch.Tensor, gsum: torch.Tensor, base: torch.Tensor | None) -> torch.Tensor:
    """IG per layer: (a - b) * sum_k w_k grad_k, summed over positions. acts/gsum [nl, S, d]."""
    a = _upcast(acts)
    diff = a if base is None else a - rearrange(base, "nl d -> nl 1 d").to(a.dtype)
    return (diff * gsum).sum(1)


def _weighted(g: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """sum_k w_k g_k over the rows of g [c, S, d] -> [S, d] (in float32 at least); weights [c, r]
    give r weighted sums -> [r, S, d]."""
    g = _upcast(g)
    return torch.einsum("c...,csd->...sd", weights.to(device=g.device, dtype=g.dtype), g)


def ig_scores(
    model: Model,
    encoded: Encoded | Sequence[Encoded],
    config: IGConfig = CLOSED_FORM,
    *,
    baseline=None,
    layers: Iterable[int] | None = None,
    progress: bool = False,
    stats: dict | None = None,
) -> Float[torch.Tensor, "n n_layers d_mlp"]:
    """Integrated gradients of every neuron: float32 [n_examples, n_layers, d_mlp] (CPU).

    ``config`` (:class:`~capinterp.kernels.ig_config.IGConfig`; default the papers' rule,
        :data:`~capinterp.kernels.ig_config.CLOSED_FORM`) holds the settings. ``config.rule`` /
        ``config.steps``: the quadrature of the path integral (:mod:`capinterp.kernels.quadrature`;
        ``steps`` points = rows per layer); ``config.positions``: ``"answer"`` or ``"last_prompt"``.
        Layers not in ``layers`` are 0. ``baseline``: None (0), a [d_mlp] vector, or one per layer
        [n_layers, d_mlp]. ``config.batch_size`` counts rows (one row = one interpolation point of one
        layer); peak memory grows with it. A single :class:`Encoded` gives n_examples = 1.

        ``rule="adaptive"``: per layer, Gauss-Legendre with 4 nodes, then refined until the layer's
        error estimate is <= ``tol`` or the nodes would pass ``max_steps`` (then a
        :class:`~capinterp.kernels.completeness.CompletenessWarning` names the layers); ``steps`` is
        not used. Refinement: composite Gauss-Legendre graded towards alpha = 0, deeper and with more
        nodes each round (8, 20, 36, 56, 80, 108 nodes) for a zero baseline on a scale-invariant model
        (Gemma 2/3: the integrand is sharp at 0); elsewhere Gauss-Legendre doubled (8, 16, ..., 128).
        One batched kernel call per round with only the unconverged layers
        (:mod:`capinterp.kernels.adaptive`). It always integrates node by node (no closed form).

        ``invariance="auto"``: on models whose FFN output is scale invariant (Gemma 2/3, see
        :mod:`capinterp.kernels.invariant`), a zero-baseline rule with at least eight nodes, all
        > 0, is summed from four nodes (3 rows per layer + 1 shared) instead of ``steps`` (same scores to float32
        noise, checked per example; an example that fails the check is integrated node by node);
        ``"off"`` always integrates.

        Completeness, always: one extra row per layer (the baseline, alpha = 0, weight 0) in the same
        batches gives ``F(baseline)``; ``F(x)`` is the clean run. ``stats`` (a dict), when given,
        receives ``{"closed_form": n, "integrated": n, "rows": n}`` (examples summed in closed form /
        integrated node by node; forward-backward rows run), ``f_clean`` [n] and, per example and
        layer ([n, n_layers] float64, NaN for layers not attributed), the records of
        :data:`capinterp.kernels.completeness.STAT_KEYS`: ``f_base``, ``attr_sum``, ``completeness``
        (:func:`~capinterp.kernels.completeness.completeness_error`), ``error_estimate`` (adaptive: its
        final estimate; closed form: its check, the top-degree term relative to the layer's largest
        score; NaN for a fixed rule), ``nodes`` (gradient rows per layer; 4 in closed form) and
        ``attr_l1`` (the scores' L1 norm).
    """
    check_config(config)
    items = _items(encoded)
    n_layers, d_mlp = neuron_shape(model)
    lay = _layers(layers, n_layers)
    if config.adaptive:
        alphas = weights = torch.zeros(0, dtype=torch.float64)
    else:
        alphas, weights = quadrature(config.steps, config.rule)
    rows = _Rows(model, config, _baseline(baseline, n_layers, d_mlp, torch.device(model.cfg.device)))
    out = torch.zeros(len(items), n_layers, d_mlp)
    rec = new_stats(len(items), n_layers)
    if config.route != "loop" and user_hooks(model):
        warnings.warn(
            "hooks are attached to the model; with route='fast'/'prefix' they see suffix-only "
            "tensors (use route='loop' to run IG under other hooks)",
            RuntimeWarning,
            stacklevel=2,
        )
    closed_ok = not config.adaptive and _closed_form_ok(model, config, rows.base, alphas)
    capped: dict[int, float] = {}
    # a zero baseline on a scale-invariant FFN output: the integrand is sharp at alpha = 0 (adaptive: graded rule)
    singular = config.adaptive and rows.base is None and scale_invariant(model)
    with frozen_params(model), torch.enable_grad():
        for i, enc in _progress(items, progress, config.route):
            s = site(enc, config.positions)
            if config.adaptive:
                ex = _adaptive_example(rows, s, lay, config, singular, capped)
            else:
                ex = _fixed_example(rows, s, lay, alphas, weights, closed_ok)
            ex.record(out, rec, i, lay)
    if capped:
        _warn_capped(capped, config)
    if stats is not None:
        stats.update(rows.counts)
        stats.update(rec)
    return out


def _progress(items: list[Encoded], progress: bool, route: str) -> Iterable[tuple[int, Encoded]]:
    it = enumerate(items)
    if progress:
        from tqdm.auto import tqdm

        return tqdm(it, total=len(items), desc=f"IG ({route})")
    return it


def _warn_capped(capped: dict[int, float], config: IGConfig) -> None:
    """The adaptive rule's warning: layers still above ``tol`` at ``max_steps`` (the worst five named)."""
    named = ", ".join(f"layer {l}: {e:.3g}" for l, e in sorted(capped.items(), key=lambda le: -le[1])[:5])
    warnings.warn(
        f"adaptive IG reached max_steps={config.max_steps} above tol={config.tol:g} on {len(capped)} layer(s), "
        f"error estimate {named}",
        CompletenessWarning,
        stacklevel=3,
    )


class _Rows:
    """The gradient rows of one :func:`ig_scores` call, on its route (:func:`_ig_loop` for ``"loop"``,
    :func:`_ig_rows` for ``"fast"`` / ``"prefix"``), with the counters its examples share."""

    def __init__(self, model: Model, config: IGConfig, base: torch.Tensor | None) -> None:
        self.model, self.base, self.route = model, base, config.route
        self.objective, self.batch_size = config.objective, config.batch_size
        self.checked: dict = {}  # whether direct block calls reproduce the model (checked on the first example)
        self.counts = {"closed_form": 0, "integrated": 0, "rows": 0}

    def __call__(self, s: Site, sub: list[int], al: torch.Tensor, w: torch.Tensor):
        """(acts, weighted gradient sums, F(x), F(baseline) per layer) for the layers ``sub``."""
        al, w, k0 = _with_zero_node(al, w)
        args = (self.model, s, sub, al, w, self.base, self.objective, self.batch_size)
        if self.route == "loop":
            self.counts["rows"] += len(sub) * len(al)
            acts, gsum, fv, f_clean = _ig_loop(*args)
        else:
            acts, gsum, fv, f_clean = _ig_rows(*args, self.route, self.checked, self.counts)
        return acts, gsum, f_clean, fv[:, k0]

    def finish(self, acts: torch.Tensor, gsum: torch.Tensor, sub: list[int]) -> torch.Tensor:
        """The layers' IG scores, float64."""
        return _finish(acts, gsum, None if self.base is None else self.base[sub]).double()


def _closed_form_ok(model: Model, config: IGConfig, base: torch.Tensor | None, alphas: torch.Tensor) -> bool:
    """Whether a fixed rule may be summed in closed form (:mod:`capinterp.kernels.invariant`)."""
    return (
        base is None
        and config.invariance == "auto"
        and len(alphas) >= 2 * N_NODES
        and bool((alphas > 0).all())
        and scale_invariant(model)
    )


@dataclass
class _Example:
    """One example's scores ``[n_sub, d_mlp]`` (float64) and records, per attributed layer."""

    ig: torch.Tensor
    f_clean: float
    f_base: torch.Tensor
    est: torch.Tensor
    nodes: torch.Tensor

    def record(self, out: torch.Tensor, rec: dict, i: int, lay: list[int]) -> None:
        """Into row ``i`` of the scores and of the stats' records."""
        ig = self.ig
        out[i, lay] = ig.float().cpu()
        sums = ig.sum(-1).cpu()
        rec["f_clean"][i] = self.f_clean
        rec["f_base"][i, lay] = self.f_base.double()
        rec["attr_sum"][i, lay] = sums
        rec["attr_l1"][i, lay] = ig.abs().sum(-1).cpu()
        rec["completeness"][i, lay] = torch.tensor(
            [completeness_error(float(a), self.f_clean, float(b)) for a, b in zip(sums, self.f_base)],
            dtype=torch.float64,
        )
        rec["error_estimate"][i, lay] = self.est
        rec["nodes"][i, lay] = self.nodes


def _adaptive_example(
    rows: _Rows, s: Site, lay: list[int], config: IGConfig, singular: bool, capped: dict[int, float]
) -> _Example:
    """``rule="adaptive"``: rounds of :func:`~capinterp.kernels.adaptive.adaptive_ig`; ``capped``
    gets the largest error estimate of each layer that reached ``max_steps``."""

    def run(sub, al, w):
        acts, gsum, f_clean, f_base = rows(s, sub, al, w)
        return rows.finish(acts, gsum, sub), f_clean, f_base

    res = adaptive_ig(run, lay, config, singular_at_zero=singular)
    for l in res.capped:
        capped[l] = max(capped.get(l, 0.0), res.error[l])
    rows.counts["integrated"] += 1
    return _Example(
        torch.stack([res.scores[l] for l in lay]),
        res.f_clean,
        torch.tensor([res.f_base[l] for l in lay]),
        torch.tensor([res.error[l] for l in lay], dtype=torch.float64),
        torch.tensor([float(res.nodes[l]) for l in lay], dtype=torch.float64),
    )


def _fixed_example(
    rows: _Rows, s: Site, lay: list[int], alphas: torch.Tensor, weights: torch.Tensor, closed_ok: bool
) -> _Example:
    """A fixed rule: summed in closed form where allowed and its check passes, else node by node."""
    closed = _closed_form(rows, s, lay, alphas, weights) if closed_ok else None
    if closed is not None:
        acts, gsum, f_clean, f_base, est = closed
        nodes = torch.full((len(lay),), float(N_NODES), dtype=torch.float64)
    else:
        acts, gsum, f_clean, f_base = rows(s, lay, alphas, weights)
        est = torch.full((len(lay),), math.nan, dtype=torch.float64)
        nodes = torch.full((len(lay),), float(len(alphas)), dtype=torch.float64)
    rows.counts["closed_form" if closed is not None else "integrated"] += 1
    return _Example(rows.finish(acts, gsum, lay), f_clean, f_base, est, nodes)


def _with_zero_node(alphas: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    """The rule with a node at alpha = 0 (the baseline, for completeness): the rule's own when it
    has one, else appended with weight 0. Returns (alphas, weights, index of the zero node)."""
    zero = (alphas == 0).nonzero()
    if len(zero):
        return alphas, weights, int(zero[0, 0])
    pad = torch.zeros(1, *weights.shape[1:], dtype=weights.dtype)
    return torch.cat([alphas, alphas.new_zeros(1)]), torch.cat([weights, pad]), len(alphas)


def _closed_form(rows, s: Site, lay: list[int], alphas: torch.Tensor, weights: torch.Tensor):
    """``(acts, sum_k w_k g(alpha_k a), F(x), F(baseline), error estimate per layer)`` from a few
    rows per layer, or None when the top-degree term is too large (scale-invariant FFN outputs:
    :mod:`capinterp.kernels.invariant`). The estimate is that term's largest value relative to
    the layer's largest weighted gradient sum."""
    nodes, high, low = substitute_nodes(alphas, weights)
    # one pass: h(alpha) = alpha g(alpha a) per node
    acts, g, f_clean, f_base = rows(s, lay, nodes.to(alphas.dtype), torch.diag(nodes))
    h = g.movedim(1, 0).double()  # [n_nodes, nl, S, d]
    q = torch.einsum("j,j...->...", high, h)
    top = torch.einsum("j,j...->...", high - low, h)
    scale = float(q.abs().max())
    if scale == 0.0 or float(top.abs().max()) > check_tolerance(acts.dtype) * scale:
        return None
    per_layer = top.abs().flatten(1).max(1).values / q.abs().flatten(1).max(1).values.clamp_min(1e-30)
    return acts, q.to(g.dtype), f_clean, f_base, per_layer.cpu()


def _ig_loop(model: Model, s: Site, lay, alphas, weights, base, objective, batch_size):
    """The straightforward route: per layer, batches of full sequences, full forward + backward."""
    device = torch.device(model.cfg.device)
    tokens = s.seq.to(device).view(1, -1)
    p0, S = s.p0, s.n_pos
    grabbed: dict[int, torch.Tensor] = {}

    def grab(act, hook):
        grabbed[int(hook.name.split(".")[1])] = act[0, p0 : p0 + S].detach().clone()

    with torch.no_grad():
        clean_logits = model.run_with_hooks(tokens, fwd_hooks=[(neuron_hook(l), grab) for l in lay])
        f_clean = float(objective_from_logits(clean_logits[:, p0 : p0 + S], s.targets, objective)[0])
    acts = torch.stack([grabbed[l] for l in lay])
    gsum = torch.zeros(len(lay), *weights.shape[1:], S, acts.shape[-1], device=device, dtype=_upcast(acts).dtype)
    fv = torch.full((len(lay), len(alphas)), float("nan"), dtype=torch.float64)
    for li, l in enumerate(lay):
        b = None if base is None else base[l]
        for c0 in range(0, len(alphas), batch_size):
            z = _points(acts[li], b, alphas[c0 : c0 + batch_size], acts.dtype)

            def put(act, hook, z=z):
                return torch.cat([act[:, :p0], z, act[:, p0 + S :]], dim=1)

            logits = model.run_with_hooks(tokens.expand(z.shape[0], -1), fwd_hooks=[(neuron_hook(l), put)])
            F = objective_from_logits(logits[:, p0 : p0 + S], s.targets, objective)
            (g,) = torch.autograd.grad(F.sum(), z)
            gsum[li] += _weighted(g, weights[c0 : c0 + batch_size]).to(gsum.dtype)
            fv[li, c0 : c0 + batch_size] = F.detach().double().cpu()
    return acts, gsum, fv, f_clean


def _ig_rows(
    model: Model, s: Site, lay, alphas, weights, base, objective, batch_size, route="fast", checked=None, stats=None
):
    """Prefix reuse + (layer, step) rows batched across layers; staircase or bridge route."""
    try:
        run = _prefix.clean_suffix(model, s.seq, s.p0, keep_cache=route == "prefix")
    except _prefix.NoCache as err:
        warnings.warn(f"the prompt prefix is not reused ({err}); IG uses route='loop'", RuntimeWarning, stacklevel=3)
        if stats is not None:
            stats["rows"] = stats.get("rows", 0) + len(lay) * len(alphas)
        return _ig_loop(model, s, lay, alphas, weights, base, objective, batch_size)
    forward: Callable[..., torch.Tensor] = _prefix.stair_logits  # or bridge_logits (no clean=)
    if route == "prefix":
        forward = _prefix.bridge_logits
    elif not _stair_ok(model, run, {} if checked is None else checked):
        run = _prefix.clean_suffix(model, s.seq, s.p0, keep_cache=True)
        forward = _prefix.bridge_logits
    acts = run.acts[lay]
    gsum = torch.zeros(
        len(lay), *weights.shape[1:], s.n_pos, acts.shape[-1], device=acts.device, dtype=_upcast(acts).dtype
    )
    m = len(alphas)
    f_clean = float(objective_from_logits(run.logits[None], s.targets, objective)[0])
    fv = torch.full((len(lay), m), float("nan"), dtype=torch.float64)
    # alpha = 1 is the clean point for every layer and baseline: one shared row (the staircase's
    # clean row) gives its gradient for all layers, instead of one row per layer
    share = SHARE_CLEAN_ROW and forward is _prefix.stair_logits
    at_one = [k for k in range(m) if float(alphas[k]) == 1.0] if share else []
    rows: list[tuple[int, int] | None] = [None] if at_one else []
    rows += [(li, k) for li in range(len(lay)) for k in range(m) if k not in at_one]
    for c0 in range(0, len(rows), batch_size):
        chunk = rows[c0 : c0 + batch_size]
        groups, index = [], []
        for li in sorted({r[0] for r in chunk if r is not None}):
            ks = [r[1] for r in chunk if r is not None and r[0] == li]
            b = None if base is None else base[lay[li]]
            groups.append((lay[li], _points(acts[li], b, alphas[ks], acts.dtype)))
            index.append((li, ks))
        clean = {}
        if None in chunk:
            clean = {l: torch.zeros_like(acts[li][None], requires_grad=True) for li, l in enumerate(lay)}
            index += [(li, at_one) for li in range(len(lay))]
        logits = forward(model, run, groups, clean=clean) if clean else forward(model, run, groups)
        F = _Objective.apply(logits, s.targets, objective == "logprob")
        grads = torch.autograd.grad(F.sum(), [z for _, z in groups] + list(clean.values()))
        for (li, ks), g in zip(index, grads):
            gsum[li] += _weighted(g.expand(len(ks), -1, -1), weights[ks]).to(gsum.dtype)
        _record(fv, F, index[: len(groups)], at_one if clean else None)
        if stats is not None:
            stats["rows"] = stats.get("rows", 0) + len(chunk)
    return acts, gsum, fv, f_clean


def _record(fv: torch.Tensor, F: torch.Tensor, index, at_one) -> None:
    """F of each row into ``fv[layer index, node]``: the shared clean row first (``at_one`` its
    nodes, for every layer), then the groups' rows in order."""
    Fd, r = F.detach().double().cpu(), 0
    if at_one is not None:
        fv[:, at_one] = Fd[0]
        r = 1
    for li, ks in index:
        fv[li, ks] = Fd[r : r + len(ks)]
        r += len(ks)


#: Run a node at alpha = 1 as one clean row for all layers (the staircase route); False runs it
#: per layer like any node (benchmarks/bench_invariance.py measures the IG kernel both ways).
SHARE_CLEAN_ROW = True

#: Whether direct block calls reproduce a model's logits, per model and (dtype, device): a property
#: of the architecture and precision, checked on the first prompt a model is attributed on.
_STAIR_OK: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _stair_ok(model: Model, run, checked: dict) -> bool:
    if "stair" not in checked:
        key = (str(run.acts.dtype), str(run.acts.device))
        known = _STAIR_OK.setdefault(model, {})
        if key not in known:
            known[key] = _prefix.stair_supported(model, run)
            if not known[key]:  # once per model and precision
                warnings.warn(_prefix.fallback_warning(model), RuntimeWarning, stacklevel=4)
        checked["stair"] = known[key]
    return checked["stair"]


def grad_x_act(
    model: Model,
    encoded: Encoded | Sequence[Encoded],
    *,
    positions: str = "answer",
    objective: str = "prob",
) -> Float[torch.Tensor, "n n_layers d_mlp"]:
    """Gradient x activation at the clean point (alpha = 1, baseline 0): [n, n_layers, d_mlp].

    One forward and one backward per example for all layers at once: a zero leaf is added to
    every layer's ``hook_post`` at the scaled positions, so each layer's gradient is the total
    derivative (paths through later layers included). The prefix runs once without gradients.
    """
    _check(positions, objective)
    items = _items(encoded)
    n_layers, d_mlp = neuron_shape(model)
    device = torch.device(model.cfg.device)
    out = torch.zeros(len(items), n_layers, d_mlp)
    # a prefix's own state (a hybrid's mixers, DeepSeek-V4's compressed attention) is not continued from:
    # transformers' continuation is not exact on every family (Jamba's Mamba layers past one token), and
    # checking it would take the full forward it saves, so the whole sequence runs there
    reuse = unshared_state(model) is None
    with frozen_params(model), torch.enable_grad():
        for i, enc in enumerate(items):
            s = site(enc, positions)
            tokens = s.seq.to(device).view(1, -1)
            cache, feed = None, tokens
            if s.p0 > 0 and reuse:
                try:
                    with torch.no_grad():
                        cache = _prefix._prefix_forward(model, tokens[:, : s.p0])
                    feed = tokens[:, s.p0 :]
                except _prefix.NoCache:
                    pass  # run the whole sequence; the scaled positions are its last n_pos
            acts: dict[int, torch.Tensor] = {}
            eps: dict[int, torch.Tensor] = {}

            def nudge(act, hook):
                l = int(hook.name.split(".")[1])
                acts[l] = act[0, -s.n_pos :].detach()
                eps[l] = torch.zeros_like(act, requires_grad=True)
                return act + eps[l]

            logits = model.run_with_hooks(
                feed, past_key_values=cache, fwd_hooks=[(neuron_hook(l), nudge) for l in range(n_layers)]
            )
            F = objective_from_logits(logits[:, -s.n_pos :], s.targets, objective)
            grads = torch.autograd.grad(F.sum(), [eps[l] for l in range(n_layers)])
            for l, g in enumerate(grads):
                out[i, l] = (_upcast(acts[l]) * _upcast(g[0, -s.n_pos :])).sum(0).float().cpu()
    return out
