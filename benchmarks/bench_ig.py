"""Benchmark the IG kernel: route="fast" against the straightforward route="loop", side by side.

    .venv/bin/python benchmarks/bench_ig.py --model smollm2 --n 4 --threads 2

Few-shot arithmetic prompts of about 30 tokens (answers of 1 and 2 digits, alternating) run
through both routes in one process, interleaved prompt by prompt so that load from other
processes hits both alike. All layers, steps=20 for "fast". The loop baseline costs about a
minute per prompt on a 2-core box, so by default it runs on a few evenly spaced layers
(``--loop-layers``) and its time is extrapolated linearly to all layers (printed as such);
``--loop-layers all`` runs it in full. Agreement is checked on the layers both computed.

Also: gradient x activation throughput and its agreement with IG; ``--with-prefix`` times the
bridge-only prefix route (ablation); ``--completeness`` prints sum(IG) vs F(a)-F(0) for one
layer at m = 20/50/200; ``--fp64-check`` reruns one prompt in float64 to show the fp32 noise
floor of both routes. Every run prints the fast route's roofline: its useful FLOPs (counted from
the rows it ran) per second against this machine's dense matmul throughput, measured in the same
run (``benchmarks/_roofline.py``); ``--roofline`` also times KN, CNL, the closed form and the
adaptive rule the same way::

    .venv/bin/python benchmarks/bench_ig.py --roofline --model smollm2 --n 2 --threads 1

``--rules`` compares quadrature rules instead (the papers' 20-point right sum against midpoint
and Gauss-Legendre, ``--rule-list``), all on the fast route, all layers, CNL positions: time per
prompt, error against a high-order Gauss-Legendre reference (``--ref-steps``), completeness
error sum(IG_l) vs F(a) - F(a_l = 0) per layer, the sigma = 6 CNL set of the prompts' mean scores
and the KN sets (last prompt token, > 0.2 max) against the reference's (IoU), and a profile of
where the time goes (unembedding + objective, i.e. ops on [.., vocabulary] tensors, vs the rest);
``--per-layer`` adds, per layer at the KN position, each rule's error and top-50 overlap::

    .venv/bin/python benchmarks/bench_ig.py --rules --model gemma3 --n 4 --threads 2
    .venv/bin/python benchmarks/bench_ig.py --rules --quick      # 2 prompts, smaller reference
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from _roofline import ig_flops, ig_variants, model_matmul_gflops, roofline

from capinterp.arch.model import load_model, neuron_hook
from capinterp.core.example import Example
from capinterp.core.tokens import encode
from capinterp.kernels.ig import grad_x_act, ig_scores
from capinterp.kernels.ig_config import IGConfig


def make_prompts(n: int, shots: int = 4, seed: int = 0) -> list[Example]:
    """``shots`` solved single-digit problems, then a query; answers alternate 1 and 2 digits."""
    rng = random.Random(seed)

    def problem(two_digits: bool | None):
        while True:
            a, b, op = rng.randint(0, 9), rng.randint(0, 9), rng.choice("+-*")
            c = a + b if op == "+" else a - b if op == "-" else a * b
            if c >= 0 and (two_digits is None or (c >= 10) == two_digits):
                return f"{a}{op}{b}=", str(c)

    out = []
    for i in range(n):
        lines = "".join(q + a + "\n" for q, a in (problem(None) for _ in range(shots)))
        q, a = problem(two_digits=i % 2 == 1)
        out.append(Example(lines + q, a, {"answer": a}))
    return out


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KB on Linux


def agreement(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float]:
    """(max rel. diff over |b| > 1% of max|b|, max|a-b| / max|b|), per example, worst case."""
    rel, scale = 0.0, 0.0
    for x, y in zip(a, b):
        big = y.abs() > 0.01 * y.abs().max()
        rel = max(rel, ((x - y).abs()[big] / y.abs()[big]).max().item())
        scale = max(scale, ((x - y).abs().max() / y.abs().max()).item())
    return rel, scale


def _ranks(x: torch.Tensor) -> torch.Tensor:
    r = torch.empty_like(x)
    r[x.argsort()] = torch.arange(x.numel(), dtype=x.dtype)
    return r


def pearson(x: torch.Tensor, y: torch.Tensor) -> float:
    x, y = x.double() - x.double().mean(), y.double() - y.double().mean()
    return (x @ y / (x.norm() * y.norm())).item()


def correlations(a: torch.Tensor, b: torch.Tensor, k: int = 100) -> tuple[float, float, float]:
    """Mean over examples of Pearson, Spearman and top-k overlap (by |score|) of two score maps."""
    ps, ss, ov = [], [], []
    for x, y in zip(a.flatten(1), b.flatten(1)):
        ps.append(pearson(x, y))
        ss.append(pearson(_ranks(x), _ranks(y)))
        tx, ty = set(x.abs().topk(k).indices.tolist()), set(y.abs().topk(k).indices.tolist())
        ov.append(len(tx & ty) / k)
    return sum(ps) / len(ps), sum(ss) / len(ss), sum(ov) / len(ov)


def objective_at(model, enc, layer: int, value: torch.Tensor | None) -> float:
    """F (mean target probability over answer positions) with hook_post[layer] set to ``value``."""
    n = len(enc.prompt_ids)
    pos = list(range(n - 1, n - 1 + len(enc.target_ids)))

    def put(act, hook):
        act = act.clone()
        act[0, pos] = value.to(act.dtype)
        return act

    hooks = [] if value is None else [(neuron_hook(layer), put)]
    with torch.no_grad():
        logits = model.run_with_hooks(torch.tensor([enc.ids], device=model.cfg.device), fwd_hooks=hooks)[0]
    logp = torch.log_softmax(logits[pos].float(), -1)
    return logp[torch.arange(len(pos)), torch.tensor(enc.target_ids)].exp().mean().item()


def parse_layers(spec: str, n_layers: int) -> list[int]:
    if spec == "all":
        return list(range(n_layers))
    if "," in spec:
        return sorted({int(x) for x in spec.split(",")})
    k = max(1, min(int(spec), n_layers))
    return sorted({round(i * (n_layers - 1) / max(1, k - 1)) for i in range(k)})


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--n", type=int, default=4, help="number of prompts")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--device", default=None)
    ap.add_argument("--loop-layers", default="4", help="'all', a count of evenly spaced layers, or a list '0,15,29'")
    ap.add_argument("--loop-n", type=int, default=None, help="run the loop baseline on the first N prompts only")
    ap.add_argument("--with-prefix", action="store_true", help="also time route='prefix' (no layer staircase)")
    ap.add_argument("--completeness", action="store_true")
    ap.add_argument("--fp64-check", action="store_true")
    ap.add_argument("--rules", action="store_true", help="compare quadrature rules (see above)")
    ap.add_argument("--rule-list", default="right:20,midpoint:10,gauss:3,gauss:5,gauss:8")
    ap.add_argument("--ref-steps", type=int, default=32, help="Gauss-Legendre points of the reference")
    ap.add_argument("--quick", action="store_true", help="with --rules: 2 prompts, 16-point reference")
    ap.add_argument("--per-layer", action="store_true", help="with --rules: error and top-50 overlap per layer")
    ap.add_argument(
        "--roofline", action="store_true", help="also time KN, CNL, closed form and adaptive IG: GFLOP/s vs matmul"
    )
    args = ap.parse_args(argv)
    if args.rules:
        from bench_ig_rules import run_rules

        return run_rules(args)

    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    model = load_model(args.model, device=args.device, threads=args.threads)
    n_layers, d_mlp = int(model.cfg.n_layers), int(model.cfg.d_mlp)
    print(
        f"model {args.model}: {n_layers} layers x {d_mlp} neurons, loaded in {time.perf_counter() - t0:.1f}s; "
        f"device {model.cfg.device}, torch threads {torch.get_num_threads()}, steps {args.steps}, "
        f"batch_size {args.batch_size}; peak RSS after load {rss_mb():.0f} MB; "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    encs = encode(model, make_prompts(args.n))
    for e in encs:
        print(
            f"  {len(e.ids):3d} tokens, {len(e.target_ids)} answer token(s): "
            f"{(e.example.prompt + e.example.target)[-14:]!r}"
        )
    loop_layers = parse_layers(args.loop_layers, n_layers)
    loop_n = len(encs) if args.loop_n is None else min(args.loop_n, len(encs))
    cfg = IGConfig(steps=args.steps, batch_size=args.batch_size)

    # warm-up (first calls allocate and initialise lazily); the fast warm-up is a full run, so the
    # peak RSS printed after it is the fast route's (the loop has not run yet)
    t = time.perf_counter()
    ig_scores(model, encs[0], cfg)
    print(
        f"warm-up: fast on prompt 0 in {time.perf_counter() - t:.2f}s; peak RSS with the fast route "
        f"{rss_mb():.0f} MB (batch_size {args.batch_size})"
    )
    ig_scores(model, encs[0], IGConfig(steps=2, route="loop"), layers=[n_layers - 1])

    fast, loop, t_fast, t_loop, t_prefix = [], [], [], [], []
    fast_flops = 0  # useful FLOPs of the fast route, counted from the rows it ran (benchmarks/_roofline.py)
    for i, enc in enumerate(encs):
        t = time.perf_counter()
        st: dict = {}
        fast.append(ig_scores(model, enc, cfg.replace(route="fast"), stats=st))
        t_fast.append(time.perf_counter() - t)
        fast_flops += ig_flops(model, enc, cfg.positions, st.get("rows", 0), list(range(n_layers)))
        line = f"  prompt {i}: fast {t_fast[-1]:.2f}s (all {n_layers} layers)"
        if args.with_prefix:
            t = time.perf_counter()
            ig_scores(model, enc, cfg.replace(route="prefix"))
            t_prefix.append(time.perf_counter() - t)
            line += f", prefix route {t_prefix[-1]:.2f}s"
        if i < loop_n:
            t = time.perf_counter()
            loop.append(ig_scores(model, enc, cfg.replace(route="loop"), layers=loop_layers))
            t_loop.append(time.perf_counter() - t)
            line += f", loop {t_loop[-1]:.2f}s ({len(loop_layers)} layers)"
        print(line, flush=True)
    fast_t, loop_t = torch.cat(fast), torch.cat(loop)

    per_fast = sum(t_fast) / len(t_fast)
    per_loop = sum(t_loop) / len(t_loop) * n_layers / len(loop_layers)
    extrap = len(loop_layers) < n_layers
    print(f"\nIG, all {n_layers} layers, steps {args.steps}:")
    print(f"  fast : {per_fast:7.2f} s/prompt = {1 / per_fast:.4f} prompts/s  (measured on {len(encs)} prompts)")
    peak = model_matmul_gflops(model, args.threads)  # the same threads, dtype and device, in this run
    print(f"  fast roofline: {roofline(fast_flops, sum(t_fast), peak)}")
    if t_prefix:
        per_prefix = sum(t_prefix) / len(t_prefix)
        print(f"  prefix route (no staircase): {per_prefix:7.2f} s/prompt = {1 / per_prefix:.4f} prompts/s")
    print(
        f"  loop : {per_loop:7.2f} s/prompt = {1 / per_loop:.4f} prompts/s  ("
        + (
            f"EXTRAPOLATED linearly from layers {loop_layers} x {n_layers}/{len(loop_layers)}"
            if extrap
            else "measured on all layers"
        )
        + f", {loop_n} prompts)"
    )
    print(f"  speed ratio fast/loop: {per_loop / per_fast:.1f}x")
    by_len: dict[int, list[float]] = {}
    for i in range(loop_n):  # fast costs ~ answer length, loop ~ sequence length
        by_len.setdefault(len(encs[i].target_ids), []).append(t_loop[i] * n_layers / len(loop_layers) / t_fast[i])
    print(
        "  ratio by answer length: "
        + ", ".join(f"{k} token(s): {sum(v) / len(v):.1f}x ({len(v)} prompts)" for k, v in sorted(by_len.items()))
    )
    # the same prompts for both: compare on the loop's layers
    rel, scale = agreement(fast_t[:loop_n, loop_layers], loop_t[:, loop_layers])
    print(
        f"  agreement on layers {loop_layers}: max rel. diff (scores > 1% of max) {rel:.2e}; "
        f"max |diff| / max |score| {scale:.2e}"
    )
    print(f"  peak RSS after the loop runs too {rss_mb():.0f} MB")

    t = time.perf_counter()
    gxa = grad_x_act(model, encs)
    per_gxa = (time.perf_counter() - t) / len(encs)
    p, s, ov = correlations(gxa, fast_t)
    print(
        f"\ngrad x act: {per_gxa:.3f} s/prompt = {1 / per_gxa:.2f} prompts/s; vs IG (fast): "
        f"Pearson {p:.3f}, Spearman {s:.3f}, top-100 overlap (|score|) {ov:.2f}"
    )

    if args.completeness:
        enc, layer = encs[0], n_layers // 2
        delta = objective_at(model, enc, layer, None) - objective_at(
            model, enc, layer, torch.zeros(len(enc.target_ids), d_mlp)
        )
        errs = []
        for m in (20, 50, 200):
            total = ig_scores(model, enc, IGConfig(steps=m), layers=[layer]).sum().item()
            errs.append(f"m={m}: {abs(total - delta) / abs(delta):.2e}")
        print(
            f"\ncompleteness, prompt 0, layer {layer}, F(a)-F(0) = {delta:.3e}; relative error of sum(IG): "
            + ", ".join(errs)
        )

    if args.fp64_check:
        lay = loop_layers
        model.to(torch.float64, print_details=False)
        truth = ig_scores(model, encs[0], cfg.replace(route="fast"), layers=lay)
        truth_loop = ig_scores(model, encs[0], cfg.replace(route="loop"), layers=lay)
        print(
            f"\nfloat64 check, prompt 0, layers {lay}: fast64 vs loop64 {agreement(truth, truth_loop)[0]:.1e}; "
            f"fp32 fast vs fp64 {agreement(fast_t[:1, lay], truth[:, lay])[0]:.2e}, "
            f"fp32 loop vs fp64 {agreement(loop_t[:1, lay], truth[:, lay])[0]:.2e} "
            "(max rel. diff on scores > 1% of max)"
        )
        model.to(torch.float32, print_details=False)

    if args.roofline:
        ig_variants(model, encs, args.threads, args.batch_size, peak)

    print(f"\npeak RSS {rss_mb():.0f} MB; load average now {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
