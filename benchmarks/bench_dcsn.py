"""DCSN throughput vs a plain batched forward over the same prompts, side by side in one run.

    .venv/bin/python benchmarks/bench_dcsn.py --model smollm2 --n 64 --batch-size 16 --threads 2

DCSN costs one forward per prompt (hooks read hook_post at the last token, then a small
projection onto the target tokens' unembedding columns); the target is within 1.5x of a
plain ``model(tokens)``. Interleaves repeats of both to average out machine noise.
"""

from __future__ import annotations

import argparse
import resource
import time

import torch
from _roofline import Dims, forward_flops, model_matmul_gflops, roofline

import capinterp as ci
from capinterp.core.tokens import batches, collate, encode, pad_id


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    model = ci.load_model(args.model, threads=args.threads)
    ds = ci.data.arithmetic(ops="+-*/", n=args.n, seed=0)
    items = encode(model, ds)
    dcsn = ci.DCSN(model, batch_size=args.batch_size, progress=False)

    @torch.no_grad()
    def plain() -> None:
        for chunk in batches(items, args.batch_size):
            b = collate(chunk, pad_id(model.tokenizer), with_target=False, device=model.cfg.device)
            model(b.tokens)

    def localize() -> None:
        dcsn.fit(ds)

    times = {"plain forward": [], "DCSN fit": []}
    for _ in range(args.repeats):
        for name, fn in (("plain forward", plain), ("DCSN fit", localize)):
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
    best = {k: min(v) for k, v in times.items()}
    # useful FLOPs: one forward per padded batch (DCSN's projection onto the targets' columns aside)
    flops = sum(
        forward_flops(Dims.of(model), max(len(e.prompt_ids) for e in c), rows=len(c))
        for c in batches(items, args.batch_size)
    )
    peak = model_matmul_gflops(model, args.threads)  # same threads, dtype and device, this run
    for k, v in best.items():
        print(f"{k:14s} {args.n / v:8.1f} prompts/s  (best of {args.repeats}: {v:.2f} s); {roofline(flops, v, peak)}")
    print(f"DCSN / plain time ratio: {best['DCSN fit'] / best['plain forward']:.2f}x (target <= 1.5x)")
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")


if __name__ == "__main__":
    main()
