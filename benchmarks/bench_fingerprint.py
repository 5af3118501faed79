"""Weights digest (model fingerprint) cost vs one forward pass, side by side in one run.

    .venv/bin/python benchmarks/bench_fingerprint.py --model smollm2 --threads 1

The digest reads every parameter once (two int64 sums of the raw bits per tensor); a cached
fingerprint only compares each parameter's identity and torch version counter. Prints the
uncached digest, the cached fingerprint and one forward of a 16-token batch of 8, and their
ratios. Interleaves repeats to average out machine noise.
"""

from __future__ import annotations

import argparse
import time

import torch

import capinterp as ci
from capinterp.core.fingerprint import model_fingerprint, refresh_fingerprint, weights_digest


def _time(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default=None)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    model = ci.load_model(args.model, threads=args.threads, device=args.device)
    tokens = torch.randint(0, int(model.cfg.d_vocab), (8, 16), device=model.cfg.device)
    n_params = sum(p.numel() for p in model.parameters())

    def digest() -> None:
        refresh_fingerprint(model)
        weights_digest(model)
        if str(model.cfg.device).startswith("cuda"):
            torch.cuda.synchronize()

    def forward() -> None:
        with torch.no_grad():
            model(tokens)
        if str(model.cfg.device).startswith("cuda"):
            torch.cuda.synchronize()

    model_fingerprint(model)
    times = {"digest": [], "cached": [], "forward": []}
    for _ in range(args.repeats):  # interleaved
        times["digest"].append(_time(digest, 1))
        times["cached"].append(_time(lambda: model_fingerprint(model), 1))
        times["forward"].append(_time(forward, 1))
    best = {k: min(v) for k, v in times.items()}
    print(
        f"model {model.capinterp_name}: {n_params:,} parameters on {model.cfg.device}, "
        f"{torch.get_num_threads()} thread(s)"
    )
    print(f"weights digest (uncached)   {best['digest'] * 1e3:9.2f} ms")
    print(f"fingerprint (cached)        {best['cached'] * 1e3:9.2f} ms")
    print(f"forward, 8 x 16 tokens      {best['forward'] * 1e3:9.2f} ms")
    print(f"digest / forward            {best['digest'] / best['forward']:9.2f}x")
    print(f"cached / forward            {best['cached'] / best['forward']:9.4f}x")


if __name__ == "__main__":
    main()
