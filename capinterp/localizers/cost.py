"""What a fit will cost, before it runs: ``localizer.estimate(data)``.

Every localizer counts the work its ``fit`` will do (a :class:`Work`: forward and backward
passes, each with its rows, tokens, blocks run and unembedded positions, from the data's token
lengths, the model's shape and the hyper-parameters) without touching the model; a short
measured probe on the real model (:func:`probe`: a few timed forward and forward + backward
passes, cached per model, thread count, device and dtype) turns the counted FLOPs and block
calls into seconds. Peak memory is the model's weights plus the largest working set the fit
holds at once (activations kept for the backward, logits, caches), from the tensor sizes.

The FLOP count of one token through one block is the matrix products' (attention projections,
attention scores against the context, the MLP: 2 FLOPs per multiply-add); the unembedding costs
``2 d_model d_vocab`` per unembedded position. The probe fits three numbers: forward FLOP/s,
the seconds of a block call beyond its FLOPs (Python and kernel launch overhead, which
dominates on tiny models), and how much slower a backward is than its forward. Those alone
under-predict real fits 2-3x (a matrix product's FLOP/s is not the kernels' at their real
shapes), so the probe then times the model's own passes of each kind (a batched forward, a
batched forward + backward, one small IG kernel call) and scales every pass of that kind by
measured / predicted. Fits that fingerprint the weights (dataset fits, AMIG) pay a first digest
of every parameter (an int64 copy of the largest one) unless the model has it cached: counted
at its measured rate.
"""

from __future__ import annotations

import math
import time
import weakref
from dataclasses import dataclass, replace
from typing import Any

import torch

from capinterp.arch.model import neuron_hook
from capinterp.core.protocol import Model
from capinterp.kernels.ig import frozen_params
from capinterp.localizers.cost_work import Work, _elem, _shape, block_flops, unembed_flops, weight_bytes

__all__ = [
    "Estimate",
    "Probe",
    "Work",
    "block_flops",
    "describe",
    "estimate",
    "estimate_line",
    "fingerprint_work",
    "probe",
    "weight_bytes",
]


# ------------------------------------------------------------------------------------- probe
@dataclass(frozen=True)
class Probe:
    """The model's measured speed: forward FLOP/s, seconds per block call beyond the FLOPs,
    backward time relative to its forward (same FLOPs), and per kind of pass (``"forward"``,
    ``"backward"``, ``"direct"``) the ratio of the model's own measured pass of that kind to what
    the first numbers predict for it (``scales``, applied to every pass of that kind)."""

    flops_per_s: float
    block_call_seconds: float
    direct_call_seconds: float
    head_call_seconds: float
    backward_ratio: float
    bytes_per_s: float
    digest_seconds_per_byte: float
    seconds: float
    scales: dict[str, float]
    device: str
    dtype: str
    threads: int


_PROBES: weakref.WeakKeyDictionary[Any, dict[tuple, Probe]] = weakref.WeakKeyDictionary()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn, device: torch.device, repeat: int = 1) -> float:
    best = math.inf
    for _ in range(repeat):
        _sync(device)
        t = time.perf_counter()
        fn()
        _sync(device)
        best = min(best, time.perf_counter() - t)
    return best


def _stair_seconds(model: Model, seq: torch.Tensor, device: torch.device) -> float | None:
    """Seconds of one row through every block by direct block calls (the IG kernels' staircase,
    :func:`capinterp.kernels.prefix.stair_logits`) at the last of ``seq``'s tokens; None where
    the model cannot take it."""
    from capinterp.kernels import prefix

    try:
        with torch.no_grad():
            run = prefix.clean_suffix(model, seq, len(seq) - 1)
            z = run.acts[0][None].clone()
            prefix.stair_logits(model, run, [(0, z)])  # warm-up
            return _timed(lambda: prefix.stair_logits(model, run, [(0, z)]), device)
    except Exception:  # no KV cache, an architecture the staircase does not serve: bridge numbers
        return None


def _matmul_rate(d_model: int, d_mlp: int, device: torch.device, dtype: torch.dtype) -> float:
    """FLOP/s of the model's typical product: 16 rows through a ``d_model x d_mlp`` weight."""
    a = torch.randn(16, d_model, device=device, dtype=dtype)
    w = torch.randn(d_model, d_mlp, device=device, dtype=dtype)
    n = max(1, int(2e8 // (2 * 16 * d_model * d_mlp)))  # about 0.2 GFLOP

    def run() -> None:
        for _ in range(n):
            a @ w

    run()
    return 2.0 * 16 * d_model * d_mlp * n / max(_timed(run, device, repeat=2), 1e-9)


def _predict(work: Work, pr: Probe) -> dict[str, float]:
    """Seconds per part of ``work`` under ``pr`` (each kind of pass scaled by ``pr.scales``)."""
    out: dict[str, float] = {}
    for key in set(work.fwd_flops) | set(work.moved_bytes):
        part, kind = key
        compute = (work.fwd_flops.get(key, 0.0) + pr.backward_ratio * work.bwd_flops.get(key, 0.0)) / pr.flops_per_s
        calls = (
            work.block_calls.get(key, 0.0) * pr.block_call_seconds
            + work.direct_calls.get(key, 0.0) * pr.direct_call_seconds
            + work.head_calls.get(key, 0.0) * pr.head_call_seconds
        )
        moved = work.moved_bytes.get(key, 0.0)
        per_byte = pr.digest_seconds_per_byte if kind == "digest" else 1.0 / pr.bytes_per_s
        secs = (compute + calls) * pr.scales.get(kind, 1.0) + moved * per_byte
        out[part] = out.get(part, 0.0) + secs
    return out


def _digest_rate(model: Model, device: torch.device) -> float:
    """Seconds per weight byte of the weights fingerprint (:func:`capinterp.core.fingerprint.weights_digest`,
    which a dataset fit keys its checkpoint with), timed on the largest block parameter."""
    from capinterp.core.fingerprint import _tensor_sums

    params = [p for n, p in model.named_parameters() if "blocks." in n] or list(model.parameters())
    p = max(params, key=lambda q: q.numel())
    secs = _timed(lambda: _tensor_sums(p), device, repeat=2)
    return secs / max(p.numel() * p.element_size(), 1)


def fingerprint_work(work: Work) -> None:
    """The first fingerprint of the model's weights (cached on the model until a weight changes):
    every parameter's raw bits summed as int64, so the largest parameter is copied at 8 bytes an
    element. Nothing when the digest is already cached."""
    from capinterp.core.fingerprint import _CACHE, _params, _state

    model = work.model
    cached = getattr(model, _CACHE, None)
    params = _params(model)
    if cached is not None and cached[0] == _state(params):
        return
    work.traffic("weights fingerprint", sum(p.numel() * p.element_size() for _, p in params), kind="digest")
    work.memory(max(p.numel() for _, p in params) * 8)
    work.note("includes the first fingerprint of the weights (cached for later fits)")


# the calibration passes: real text, the shapes the kernels run (a batch of short rows)
_CAL_PROMPT, _CAL_TARGET = "The capital of France is the city of", " Paris"


def _calibrate(model: Model, first: Probe, device: torch.device) -> dict[str, float]:
    """Per kind of pass, measured seconds of one of the model's own passes of that kind over the
    seconds ``first`` predicts for it: a batched no-grad forward (``"forward"``), a batched
    forward + backward (``"backward"``) and one small IG kernel call on the fast route
    (``"direct"``, the rows KN, CNL, AMIG and SIG run). A kind whose pass fails keeps scale 1."""
    from capinterp.arch.forward import capture
    from capinterp.core.example import Example
    from capinterp.core.tokens import encode
    from capinterp.kernels import ig as ig_kernel
    from capinterp.kernels.ig_config import IGConfig
    from capinterp.localizers.cost_counts import forward_work, ig_work

    scales: dict[str, float] = {}

    def scale(kind: str, fn, count) -> None:
        try:  # no warm-up: the probe's passes above ran these code paths already
            measured = _timed(fn, device)
        except Exception:  # an architecture a calibration pass does not serve: the FLOP model alone
            return
        work = Work(model)
        count(work)
        predicted = sum(_predict(work, first).values())
        scales[kind] = float(min(max(measured / max(predicted, 1e-9), 0.25), 16.0))

    items = list(encode(model, [Example(_CAL_PROMPT, _CAL_TARGET)]))
    ids = torch.tensor([items[0].prompt_ids] * 4, device=device)
    T = ids.shape[1]

    def fwd() -> None:
        with torch.no_grad():
            capture(model, ids, "ln_final.hook_in")

    scale("forward", fwd, lambda w: forward_work(w, "x", [T] * 4, 4, logits=0))

    def fwd_bwd() -> None:
        def leaf(act, hook):
            return act.detach().requires_grad_(True)

        with frozen_params(model), torch.enable_grad():
            logits = model.run_with_hooks(ids[:1], fwd_hooks=[(neuron_hook(0), leaf)])
            logits[:, -1].float().logsumexp(-1).sum().backward()

    scale("backward", fwd_bwd, lambda w: w.add("x", rows=1, tokens=T, logits=T, grad=True))
    config = IGConfig(steps=1, batch_size=32, invariance="off", completeness_tol=None)
    scale("direct", lambda: ig_kernel.ig_scores(model, items[0], config), lambda w: ig_work(w, items, config))
    return scales


def probe(model: Model) -> Probe:
    """Time a few tiny passes on ``model`` where it is (its device and dtype), once per model,
    thread count, device and dtype in this process. Leaves the model, its parameters'
    ``requires_grad`` and its hooks as they were; about a second on Gemma 3 270M on one CPU thread."""
    device = torch.device(model.cfg.device)
    dtype = next(model.parameters()).dtype
    key = (torch.get_num_threads(), str(device), str(dtype))
    cached = _PROBES.get(model, {}).get(key)
    if cached is not None:
        return cached
    sh = _shape(model)
    L = sh["n_layers"]
    gen = torch.Generator().manual_seed(0)
    vocab = min(sh["d_vocab"], 1000)
    small = torch.randint(1, vocab, (1, 1), generator=gen).to(device)
    big = torch.randint(1, vocab, (1, 4), generator=gen).to(device)

    def flops(t: torch.Tensor) -> float:
        b, n = t.shape
        return b * n * L * block_flops(sh, n / 2) + b * n * unembed_flops(sh)

    def fwd(t: torch.Tensor) -> None:
        with torch.no_grad():
            model.run_with_hooks(t, fwd_hooks=[])

    def fwd_bwd(t: torch.Tensor) -> None:
        def leaf(act, hook):
            return act.detach().requires_grad_(True)

        with frozen_params(model), torch.enable_grad():
            logits = model.run_with_hooks(t, fwd_hooks=[(neuron_hook(0), leaf)])
            logits.float().logsumexp(-1).sum().backward()

    t0 = time.perf_counter()
    buf = torch.zeros(2, 1 << 22, device=device, dtype=torch.float32)
    t_copy = _timed(lambda: buf[0].add_(buf[1]), device, repeat=3)  # 3 x 16 MB moved
    bandwidth = 3 * 4 * (1 << 22) / max(t_copy, 1e-9)
    fwd(small)  # warm-up: first-call allocations
    t_small = _timed(lambda: fwd(small), device)
    t_big = _timed(lambda: fwd(big), device)
    t_both = _timed(lambda: fwd_bwd(big), device)
    t_stair = _stair_seconds(model, big[0], device)
    # every pass reads each weight it uses once, whatever its rows: a per-call cost (memory bound
    # for a few rows), the unembedding's weights apart from the blocks'
    head_bytes = sh["d_model"] * sh["d_vocab"] * _elem(model)
    block_bytes = sum(p.numel() * p.element_size() for n, p in model.named_parameters() if "blocks." in n) / L
    f_small, f_big = flops(small), flops(big)
    rate = _matmul_rate(sh["d_model"], sh["d_mlp"], device, dtype)
    head_call = head_bytes / bandwidth
    py = max(t_small - f_small / rate - head_call - L * block_bytes / bandwidth, 0.0) / (L + 1)
    block_call = py + block_bytes / bandwidth
    per_pass = L * block_call + head_call + py
    direct = block_call
    if t_stair is not None:  # the IG kernels' direct block calls skip the bridge's hooks
        direct_py = max(t_stair - f_small / rate - head_call - L * block_bytes / bandwidth, 0.0) / (L + 1)
        direct = min(direct_py, py) + block_bytes / bandwidth
    ratio = (t_both - t_big - per_pass) / max(f_big / rate, 1e-9)
    first = Probe(
        flops_per_s=float(rate),
        block_call_seconds=float(block_call),
        direct_call_seconds=float(direct),
        head_call_seconds=float(head_call + py),
        backward_ratio=float(min(max(ratio, 0.5), 6.0)),
        bytes_per_s=float(bandwidth),
        digest_seconds_per_byte=_digest_rate(model, device),
        seconds=0.0,
        device=str(device),
        dtype=str(dtype).replace("torch.", ""),
        threads=torch.get_num_threads(),
        scales={},
    )
    scales = _calibrate(model, first, device)
    result = replace(first, seconds=time.perf_counter() - t0, scales=scales)
    _PROBES.setdefault(model, {})[key] = result
    return result


# ---------------------------------------------------------------------------------- estimate
def describe(nbytes: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if nbytes >= size:
            return f"{nbytes / size:.3g} {unit}"
    return f"{int(nbytes)} B"


@dataclass(frozen=True)
class Estimate:
    """Predicted cost of one ``fit``: wall ``seconds`` and ``peak_bytes`` (weights + working set)
    on this machine, the forward(+backward) ``passes`` counted, the IG / restoration ``rows``,
    the ``probe_seconds`` spent measuring, and seconds per part of the fit (``breakdown``)."""

    method: str
    seconds: float
    peak_bytes: int
    working_bytes: int
    passes: int
    rows: int
    probe_seconds: float
    breakdown: dict[str, float]
    device: str
    threads: int
    notes: tuple[str, ...] = ()

    def __str__(self) -> str:
        parts = ", ".join(f"{k} {_secs(v)}" for k, v in sorted(self.breakdown.items(), key=lambda kv: -kv[1]))
        text = (
            f"{self.method}: about {_secs(self.seconds)}, peak memory about {describe(self.peak_bytes)} "
            f"({describe(self.working_bytes)} beyond the weights); {self.passes} passes"
            + (f", {self.rows} rows" if self.rows else "")
            + f" [{parts}] on {self.device}, {self.threads} thread(s); probe {self.probe_seconds:.2f} s"
        )
        return text + "".join(f"; {n}" for n in self.notes)


def _secs(s: float) -> str:
    if s >= 3600:
        return f"{s / 3600:.1f} h"
    if s >= 120:
        return f"{s / 60:.1f} min"
    return f"{s:.3g} s"


def _fingerprints(loc: Any) -> bool:
    """Whether ``loc.fit`` fingerprints the model's weights (dataset fits key their checkpoint with
    it; AMIG keys its baseline with it; QueryLocalization: its localizer's)."""
    inner = getattr(loc, "localizer_", loc)
    return bool(getattr(inner, "fingerprints_weights", False)) or getattr(inner, "name", "") == "amig"


def estimate(loc: Any, data: Any) -> Estimate:
    """``loc._cost(data)`` (validates ``data`` like ``fit``, counts the work, touches no model),
    then the probe, then seconds = FLOPs / rate + block calls x call overhead."""
    work: Work = loc._cost(data)
    if _fingerprints(loc):
        fingerprint_work(work)
    pr = probe(loc.model)
    breakdown = _predict(work, pr)
    return Estimate(
        method=getattr(loc, "name", type(loc).__name__.lower()),
        seconds=float(sum(breakdown.values())),
        peak_bytes=weight_bytes(loc.model) + work.working_bytes,
        working_bytes=work.working_bytes,
        passes=work.passes,
        rows=work.rows,
        probe_seconds=pr.seconds,
        breakdown=breakdown,
        device=pr.device,
        threads=pr.threads,
        notes=tuple(work.notes),
    )


def estimate_line(loc: Any, data: Any) -> str:
    """``"estimate: ..."`` for a progress message before a long fit (the CLI's); a model or data the
    cost model cannot count gives a line saying so instead of an error (``fit`` will report it)."""
    try:
        return f"estimate: {loc.estimate(data)}"
    except Exception as err:  # never block the run: fit validates and raises with its own message
        return f"estimate: not available ({type(err).__name__}: {err})"
