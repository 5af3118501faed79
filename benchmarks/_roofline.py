"""A roofline for the benchmarks: useful FLOPs counted from shapes, beside measured matmul throughput.

Every kernel's work is counted from the shapes it actually runs (no profiler): a dense
transformer block over ``q`` query positions attending to ``k`` keys costs

* matmuls: ``2 * q * (params in the block's matmuls)`` (Q, K, V, O and the FFN's two or three
  projections; K and V are projected for the ``q`` new positions only, grouped-query heads counted
  as the model has them);
* attention: ``4 * q * k * n_heads * d_head`` (scores ``Q K^T`` and ``softmax(.) V``, the causal mask
  not subtracted: the kernels compute the full rectangle);

and the unembedding ``2 * positions * d_model * d_vocab``. The kernels' backward passes take
gradients with respect to activations only (the parameters need none): one matmul per forward
matmul (``dX = dY W^T``), two per attention product (both of its inputs are activations), so a
row run forward and back costs 2x its matmuls and 3x its attention (:func:`block_flops` with
``grad=True``). The same convention as ``ig_cost`` in ``benchmarks/bench_scale.py``, which agrees
with ``torch.utils.flop_counter`` (docs/scale.md). Norms, activations and softmax are not counted.

:func:`matmul_gflops` times a dense ``[rows, d_model] @ [d_model, d_mlp]`` matmul (the FFN's
shape) at the given thread count, dtype and device, best of a few repeats: the ceiling a kernel's
GFLOP/s is put against (:func:`roofline`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Dims:
    """The shapes the FLOP counters need, read off a TransformerLens config."""

    n_layers: int
    d_model: int
    d_mlp: int
    n_heads: int
    d_head: int
    n_kv: int
    d_vocab: int
    gated: bool

    @classmethod
    def of(cls, model) -> Dims:
        c = model.cfg
        n_kv = getattr(c, "n_key_value_heads", None) or c.n_heads
        gated = bool(getattr(c, "gated_mlp", False))
        return cls(
            int(c.n_layers),
            int(c.d_model),
            int(c.d_mlp),
            int(c.n_heads),
            int(c.d_head),
            int(n_kv),
            int(c.d_vocab),
            gated,
        )

    @property
    def block_matmul_params(self) -> int:
        """Weights in one block's matmuls: Q and O (n_heads), K and V (n_kv heads), the FFN."""
        attn = 2 * self.d_model * self.n_heads * self.d_head + 2 * self.d_model * self.n_kv * self.d_head
        return attn + (3 if self.gated else 2) * self.d_model * self.d_mlp


def block_flops(d: Dims, q: int, k: int, grad: bool = False) -> int:
    """One block's forward FLOPs over ``q`` query positions attending to ``k`` keys; ``grad``: plus
    the activation-gradient backward (matmuls once more, attention twice more)."""
    mm, att = 2 * q * d.block_matmul_params, 4 * q * k * d.n_heads * d.d_head
    return 2 * mm + 3 * att if grad else mm + att


def unembed_flops(d: Dims, positions: int, grad: bool = False) -> int:
    return (2 if grad else 1) * 2 * positions * d.d_model * d.d_vocab


def forward_flops(
    d: Dims, T: int, *, rows: int = 1, last: int | None = None, unembed: int | None = None, grad: bool = False
) -> int:
    """A forward pass of ``rows`` sequences of ``T`` tokens through blocks ``0..last`` (default: all),
    plus the unembedding at ``unembed`` positions per row (default ``T``; 0 for none); ``grad``: and
    the activation-gradient backward."""
    last = d.n_layers - 1 if last is None else last
    u = T if unembed is None else unembed
    return rows * ((last + 1) * block_flops(d, T, T, grad) + unembed_flops(d, u, grad))


def ig_fast_flops(d: Dims, T: int, p0: int, n_pos: int, rows: int, layers: list[int]) -> int:
    """IG's fast route for one example: the clean run over all ``T`` tokens (forward), then ``rows``
    forward + backward rows, each over the ``n_pos`` scaled positions (keys: all ``T``), entering at
    its layer (a layer staircase; rows spread evenly over ``layers``), logits at those positions."""
    clean = forward_flops(d, T)
    stair = [(d.n_layers - l) * block_flops(d, n_pos, T, grad=True) for l in layers]
    per_row = sum(stair) / len(stair) + unembed_flops(d, n_pos, grad=True)
    return clean + int(rows * per_row)


def trace_flops(d: Dims, block_positions: int, T: int) -> int:
    """Causal tracing: a count of block x position evaluations (``bench_trace.block_positions``),
    each one position's block over at most ``T`` keys (the last-position unembeddings aside)."""
    return block_positions * block_flops(d, 1, T)


def eap_flops(d: Dims, T: int, n_pairs: int, steps: int, n_src: int, n_slots: int) -> int:
    """EAP / EAP-IG: per pair a clean and a corrupted forward, ``steps`` forward + backward rows, and
    the edge scores ``einsum(d_out, grads)`` (``2 * T * n_src * n_slots * d_model``)."""
    per = 2 * forward_flops(d, T) + steps * forward_flops(d, T, grad=True) + 2 * T * n_src * n_slots * d.d_model
    return n_pairs * per


def matmul_gflops(
    threads: int,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    *,
    shape=(256, 576, 1536),
    repeats: int = 5,
) -> float:
    """Best-of-``repeats`` GFLOP/s of a dense ``[m, k] @ [k, n]`` matmul (``shape = (m, k, n)``) at
    ``threads`` torch threads (restored after), on ``device`` in ``dtype``. Each repeat runs about
    0.1 s of matmuls."""
    if threads < 1 or repeats < 1 or min(shape) < 1:
        raise ValueError(f"threads, repeats and shape must be positive, got {threads}, {repeats}, {shape}")
    m, k, n = shape
    dev = torch.device(device)
    a = torch.randn(m, k, device=dev).to(dtype)
    b = torch.randn(k, n, device=dev).to(dtype)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        a @ b  # warm-up
        sync()
        t = time.perf_counter()
        a @ b
        sync()
        iters = max(1, int(0.1 / max(time.perf_counter() - t, 1e-6)))
        best = float("inf")
        for _ in range(repeats):
            t = time.perf_counter()
            for _ in range(iters):
                a @ b
            sync()
            best = min(best, (time.perf_counter() - t) / iters)
    finally:
        torch.set_num_threads(old)
    return 2 * m * k * n / best / 1e9


def model_matmul_gflops(model, threads: int, rows: int = 256) -> float:
    """:func:`matmul_gflops` at the model's FFN shape, dtype and device."""
    d = Dims.of(model)
    dtype = next(model.parameters()).dtype
    return matmul_gflops(threads, dtype, model.cfg.device, shape=(rows, d.d_model, d.d_mlp))


def roofline(flops: float, seconds: float, peak_gflops: float) -> str:
    """``"12.3 GFLOP/s = 45% of matmul"``: a kernel's useful FLOP rate beside the measured peak."""
    g = flops / seconds / 1e9
    return f"{g:.2f} GFLOP/s = {100 * g / peak_gflops:.1f}% of matmul ({peak_gflops:.1f} GFLOP/s)"


def ig_flops(model, enc, positions: str, rows: int, layers: list[int]) -> int:
    """:func:`ig_fast_flops` for one encoded example as :func:`capinterp.kernels.ig.ig_scores` runs it
    (``rows``: its ``stats["rows"]``)."""
    from capinterp.kernels.ig import site

    s = site(enc, positions)
    return ig_fast_flops(Dims.of(model), len(s.seq), s.p0, s.n_pos, rows, layers)


def ig_variants(model, encs, threads: int, batch_size: int, peak: float) -> None:
    """Time the IG fast route per variant (KN / CNL positions, the closed form, the adaptive rule)
    over ``encs``, all layers, and print each one's roofline against ``peak`` GFLOP/s."""
    from capinterp.kernels.ig import ig_scores
    from capinterp.kernels.ig_config import CLOSED_FORM, IGConfig

    layers = list(range(int(model.cfg.n_layers)))
    variants = {
        "KN (last prompt token, right:20)": IGConfig(steps=20, positions="last_prompt", batch_size=batch_size),
        "CNL (answer positions, right:20)": IGConfig(steps=20, batch_size=batch_size),
        "closed form (default config)": CLOSED_FORM.replace(batch_size=batch_size),
        "adaptive rule (CNL positions)": IGConfig(rule="adaptive", batch_size=batch_size),
    }
    print(f"\nroofline, IG fast route, all layers, {len(encs)} prompts, {threads} thread(s):")
    for name, cfg in variants.items():
        flops, sec, rows = 0, 0.0, 0
        for enc in encs:
            st: dict = {}
            t = time.perf_counter()
            ig_scores(model, enc, cfg.replace(route="fast"), stats=st)
            sec += time.perf_counter() - t
            rows += st.get("rows", 0)
            flops += ig_flops(model, enc, cfg.positions, st.get("rows", 0), layers)
        print(f"  {name:34s} {sec / len(encs):6.2f} s/prompt, {rows} rows: {roofline(flops, sec, peak)}")
