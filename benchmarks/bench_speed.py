"""Seconds per example of CNL, KN and DCSN on the packaged models: the one table the docs quote.

    .venv/bin/python benchmarks/bench_speed.py                      # smollm2 and gemma3, n=3, 1 thread
    .venv/bin/python benchmarks/bench_speed.py --models smollm2 --n 2 --methods cnl,dcsn

Each model runs each method with its defaults (steps=20, the papers' right Riemann sum, the fast
IG kernel) on the README's data, ``ci.data.arithmetic(ops="+", fmt="DG", seed=0)`` (compact
style, single digits), after one untimed warm-up fit per model and method; each of the ``--n``
examples is fitted on its own, interleaved over models and methods so that load from other
processes hits every cell alike, and the table gives the median seconds. ``cnl-noinv`` is CNL with ``invariance="off"`` (every quadrature node
integrated): on Gemma 3 the default sums the rule in closed form from 4 nodes per layer instead of
20 (:mod:`capinterp.kernels.invariant`), on SmolLM2 (no post-FFN norm) the two are the same
route. The table also gives layers and IG rows per example (layers x nodes x answer positions),
the cost driver, and the load average before and after (above the thread count = contention).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import capinterp as ci
from capinterp.core.tokens import encode
from capinterp.kernels.invariant import scale_invariant

METHODS = {
    "cnl": lambda m: ci.CNL(m, progress=False),
    "cnl-noinv": lambda m: ci.CNL(m, invariance="off", progress=False),
    "kn": lambda m: ci.KN(m, progress=False),
    "dcsn": lambda m: ci.DCSN(m, progress=False),
}


def seconds(make, model, examples) -> float:
    """Wall seconds of ``make(model).fit(examples)``."""
    t0 = time.perf_counter()
    make(model).fit(examples)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="smollm2,gemma3")
    ap.add_argument("--methods", default="cnl,cnl-noinv,kn,dcsn", help=f"from {', '.join(METHODS)}")
    ap.add_argument("--n", type=int, default=3, help="timed examples per method")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    methods = [s.strip() for s in args.methods.split(",") if s.strip()]
    names = [s.strip() for s in args.models.split(",") if s.strip()]
    unknown = [m for m in methods if m not in METHODS]
    if unknown or args.n < 1:
        ap.error(f"unknown methods {unknown} (choose from {list(METHODS)}) or --n < 1")
    load_before = os.getloadavg()
    data = ci.data.arithmetic(ops="+", n=args.n + 1, fmt="DG", lang="en", seed=0)
    warm, timed = data[:1], data[1:]
    models = {name: ci.load_model(name, threads=args.threads) for name in names}
    for model in models.values():  # warm-up: first-call allocations, lazy initialisation
        for meth in methods:
            seconds(METHODS[meth], model, warm)
    times: dict[tuple[str, str], list[float]] = {(n, m): [] for n in names for m in methods}
    for i, ex in enumerate(timed):  # interleaved, so that load from other processes hits every cell alike
        for name, model in models.items():
            for meth in methods:
                times[name, meth].append(seconds(METHODS[meth], model, [ex]))
                print(f"  example {i}: {name} {meth} {times[name, meth][-1]:.2f} s", file=sys.stderr, flush=True)
    load_after = os.getloadavg()

    print(
        f"s/example (median over n={args.n} examples fitted one at a time, interleaved; after one warm-up), "
        f"{args.threads} thread(s), torch {torch.__version__}"
    )
    head = ["model", "layers x d_mlp", "vocab", "tokens/ex", "CNL IG rows/ex", *methods]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for name, model in models.items():
        enc = encode(model, timed)
        tokens = sum(len(e.prompt_ids) + len(e.target_ids) for e in enc) / len(enc)
        answers = sum(len(e.target_ids) for e in enc) / len(enc)
        nodes = 4 if scale_invariant(model) else 20  # 3 rows per layer + 1 shared, vs one row per node
        cfg = model.cfg
        cells = [name, f"{cfg.n_layers} x {cfg.d_mlp}", f"{cfg.d_vocab:,}", f"{tokens:.0f}"]
        cells += [
            f"{cfg.n_layers * nodes * answers:.0f}",
            *(f"{statistics.median(times[name, m]):.2f}" for m in methods),
        ]
        print("| " + " | ".join(cells) + " |")
    cores = os.cpu_count() or 1
    busy = max(load_before[0], load_after[0])
    note = "CONTENDED: other processes shared the cores" if busy > args.threads + 0.5 else "quiet"
    print(
        f"load average (1 min) before {load_before[0]:.2f}, after {load_after[0]:.2f} on {cores} cores: {note} "
        "(under contention absolute times are upper bounds; the interleaved ratios hold better)"
    )


if __name__ == "__main__":
    main()
