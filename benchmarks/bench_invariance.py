"""Closed-form IG on scale-invariant FFN outputs against node-by-node integration, side by side.

    .venv/bin/python benchmarks/bench_invariance.py --model gemma3 --n 4 --threads 1
    .venv/bin/python benchmarks/bench_invariance.py --model gemma3 --n 2 --profile

On Gemma 3 (post-FFN RMSNorm, :mod:`capinterp.kernels.invariant`) the kernel's default
``invariance="auto"`` sums a rule from four nodes (three rows per layer plus one clean row shared
by all layers); ``"off"`` integrates every node; "before" integrates every node with every node of every
layer its own row (``ig.SHARE_CLEAN_ROW = False``): the default before either saving.
For CNL's positions (every answer position) and KN's (the last prompt token), each rule runs both
ways, interleaved prompt by prompt so machine load hits both alike, on the fast route, all
layers. Printed per rule: seconds per prompt each way and their ratio, the largest difference
between the two relative to the largest score (float32 noise is ~1e-5 here: compare two exact
routes with ``bench_ig.py --fp64-check``), the top-100 neurons they share, how many prompts the
check accepted, and each one's error against a high-order reference (Gauss-Legendre, ``--ref``
points, integrated node by node; on Gemma 3 no rule converges to it, see docs/results.md).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))

from bench_ig import make_prompts

from capinterp.arch.model import load_model
from capinterp.core.tokens import encode
from capinterp.kernels import ig
from capinterp.kernels.ig import ig_scores
from capinterp.kernels.ig_config import IGConfig


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| / max |b| over each prompt's scores, the worst prompt."""
    return float(((a - b).abs().amax((1, 2)) / b.abs().amax((1, 2))).max())


def top_shared(a: torch.Tensor, b: torch.Tensor, k: int = 100) -> int:
    """Neurons shared by the top-k (|score|) of the prompts' mean scores."""
    ta = set(a.mean(0).flatten().abs().topk(k).indices.tolist())
    return len(ta & set(b.mean(0).flatten().abs().topk(k).indices.tolist()))


def _node_grad(model, enc, alpha: float) -> torch.Tensor:
    """``alpha dF/da(alpha a)`` at every layer and CNL position: the kernel's rows for one node."""
    al = torch.tensor([alpha], dtype=torch.float64)
    lay = list(range(int(model.cfg.n_layers)))
    with ig.frozen_params(model), torch.enable_grad():
        _, g, _, _ = ig._ig_rows(model, ig.site(enc, "answer"), lay, al, al, None, "prob", 64, "fast", {})
    return g.float().cpu()


def profile(model, enc, batch_size: int) -> int:
    """cProfile of one closed-form CNL call (right:20; after a warm-up call): where the time goes."""
    import cProfile
    import pstats

    ig_scores(model, [enc], IGConfig(steps=20, batch_size=batch_size))
    prof = cProfile.Profile()
    prof.runcall(ig_scores, model, [enc], steps=20, batch_size=batch_size)
    stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]
    cum = {}
    for (file, _, name), (_, _, _, ct, _) in stats.items():
        for label, (f, n) in {
            "total (ig_scores)": ("kernels/ig.py", "ig_scores"),
            "unembedding, forward": ("arch/forward.py", "unembed"),
            "backward (autograd.grad)": ("autograd/__init__.py", "grad"),
            "clean prefix + suffix run": ("kernels/prefix.py", "clean_suffix"),
            "fast route's self-check": ("kernels/prefix.py", "stair_supported"),
        }.items():
            if file.endswith(f) and name == n:
                cum[label] = cum.get(label, 0.0) + ct
    print(f"one prompt of {len(enc.ids)} tokens, {len(enc.target_ids)} answer token(s), right:20, invariance='auto':")
    for label, t in cum.items():
        print(f"  {label:<28} {t:6.2f} s")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="gemma3")
    ap.add_argument("--n", type=int, default=4, help="number of prompts")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rules", default="right:20,midpoint:10,gauss:5")
    ap.add_argument("--ref", type=int, default=20, help="Gauss-Legendre points of the reference")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--profile", action="store_true", help="only profile one closed-form CNL call (second prompt)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    model = load_model(args.model, threads=args.threads)
    encs = encode(model, make_prompts(args.n))
    print(
        f"model {args.model}: {model.cfg.n_layers} layers x {model.cfg.d_mlp} neurons; {len(encs)} prompts of "
        f"{min(len(e.ids) for e in encs)}-{max(len(e.ids) for e in encs)} tokens; torch threads "
        f"{torch.get_num_threads()}; load average {os.getloadavg()[0]:.1f}"
    )
    if args.profile:
        return profile(model, encs[min(1, len(encs) - 1)], args.batch_size)
    # The premise: h(alpha) = alpha dF/da(alpha a) is flat (scale invariance) but for the norm's eps.
    g1 = _node_grad(model, encs[0], 1.0)
    devs = {
        al: float((_node_grad(model, encs[0], al) - g1).abs().max() / g1.abs().max()) for al in (0.5, 0.2, 0.1, 0.05)
    }
    print(
        "h(alpha) vs h(1), first prompt, max |diff| / max |h(1)|: "
        + ", ".join(f"alpha {k}: {v:.1e}" for k, v in devs.items())
    )
    rules = [(r.split(":")[0], int(r.split(":")[1])) for r in args.rules.split(",")]
    print(
        f"{'positions':<12} {'rule':<12} {'auto s/p':>9} {'off s/p':>9} {'speed-up':>9} {'before s/p':>10} "
        f"{'vs before':>9} {'auto vs off':>12} {'top100':>7} {'closed':>7} {'auto vs ref':>12} {'off vs ref':>11}"
    )
    for positions, label in (("answer", "CNL"), ("last_prompt", "KN")):
        cfg = IGConfig(positions=positions, batch_size=args.batch_size)
        ref = torch.cat(
            [ig_scores(model, [e], cfg.replace(steps=args.ref, rule="gauss", invariance="off")) for e in encs]
        )
        for rule, steps in rules:
            auto, off, t_auto, t_off, t_before, closed = [], [], 0.0, 0.0, 0.0, 0
            for e in encs:
                stats: dict = {}
                t0 = time.perf_counter()
                auto.append(ig_scores(model, [e], cfg.replace(steps=steps, rule=rule), stats=stats))
                t1 = time.perf_counter()
                off.append(ig_scores(model, [e], cfg.replace(steps=steps, rule=rule, invariance="off")))
                t2 = time.perf_counter()
                ig.SHARE_CLEAN_ROW = False  # before either saving: every node of every layer its own row
                try:
                    ig_scores(model, [e], cfg.replace(steps=steps, rule=rule, invariance="off"))
                finally:
                    ig.SHARE_CLEAN_ROW = True
                t_auto, t_off, t_before = t_auto + t1 - t0, t_off + t2 - t1, t_before + time.perf_counter() - t2
                closed += stats["closed_form"]
            a, o = torch.cat(auto), torch.cat(off)
            print(
                f"{positions + ' (' + label + ')':<12} {rule + ':' + str(steps):<12} {t_auto / len(encs):9.2f} "
                f"{t_off / len(encs):9.2f} {t_off / t_auto:8.2f}x {t_before / len(encs):10.2f} "
                f"{t_before / t_auto:8.2f}x {rel(a, o):12.1e} {top_shared(a, o):7d} "
                f"{closed:>4d}/{len(encs)} {rel(a, ref):12.2e} {rel(o, ref):11.2e}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
