"""Exact single-head patching: the stair route against the full graph pass per head, in one run.

    .venv/bin/python benchmarks/bench_head_patching.py --model smollm2 --n 8 --threads 1

Both routes compute ``head_effects`` (zero ablation) on the same prompts; the script prints their
times, the ratio, the largest difference between the two (they must agree to 1e-5 in float32), and
each route's useful FLOP rate beside this machine's matmul throughput at the same thread count and
dtype (:mod:`_roofline`). The graph route runs every head's full forward (unembedding the answer position only, since
``run_graph(at=)``); the stair route reuses the clean run below each head's layer.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from _roofline import Dims, block_flops, forward_flops, model_matmul_gflops, roofline, unembed_flops

import capinterp as ci
from capinterp.circuits.graph import Graph
from capinterp.circuits.head_patching import head_effects
from capinterp.core.tokens import batches, encode


def _flops(model, items, batch_size: int) -> dict[str, int]:
    """Useful FLOPs of each route (the graph pass's node and slot bookkeeping not counted)."""
    d, g = Dims.of(model), Graph.from_model(model)
    n_heads = len(g.head_layers) * g.n_heads
    graph = 0
    for chunk in batches(items, batch_size):
        T = max(len(it.ids) for it in chunk)
        graph += (n_heads + 1) * forward_flops(d, T, rows=len(chunk), unembed=1)  # the answer position only
    stair = 0
    for it in items:
        S, T = len(it.prompt_ids), len(it.ids)
        stair += forward_flops(d, T, unembed=1) + forward_flops(d, S)  # the graph run and the clean record
        stair += sum(g.n_heads * (d.n_layers - l) * block_flops(d, S, S) for l in g.head_layers)
        stair += n_heads * unembed_flops(d, 1)
    return {"graph": graph, "stair": stair}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    model = ci.load_model(args.model, threads=args.threads)
    ds = ci.data.arithmetic(ops="+-", n=args.n, seed=0)
    items = encode(model, ds)
    out, sec = {}, {}
    for route in ("graph", "stair"):
        t = time.perf_counter()
        out[route] = head_effects(model, ds, route=route, batch_size=args.batch_size)
        sec[route] = time.perf_counter() - t
    flops = _flops(model, items, args.batch_size)
    peak = model_matmul_gflops(model, args.threads)  # same threads, dtype and device, this run
    for route in ("graph", "stair"):
        print(f"{route:6s} route {sec[route]:8.2f} s  {roofline(flops[route], sec[route], peak)}")
    diff = float(np.nanmax(np.abs(out["graph"] - out["stair"])))
    print(f"graph / stair time ratio: {sec['graph'] / sec['stair']:.2f}x; largest difference {diff:.2e}")


if __name__ == "__main__":
    main()
