"""ACDC: the layer route (trials from the tried slot's layer up) against the full route, in one run.

    .venv/bin/python benchmarks/bench_acdc.py --layers 2,4 --threads 1

For each tiny model (``load_model("tiny", n_layers=L)``) both routes prune the same facts with
the same threshold; the script prints each route's time, the ratio, whether the kept edges are the
same, the largest difference of the trial deltas, and each route's useful FLOP rate beside this
machine's matmul throughput at the same thread count and dtype (:mod:`_roofline`). Useful FLOPs:
the full route runs ``n_edges + 2`` whole forwards (logits at every position); the layer route runs
two whole forwards, the recorded start and its check, then each trial's blocks from its slot's layer
up and the unembedding at the answer positions only. The graph's bookkeeping (node outputs, the
removed edges' subtraction) is not counted: on models this small it is a large share of the work,
so the percentages are low for both routes.
"""

from __future__ import annotations

import argparse
import time

from _roofline import Dims, block_flops, forward_flops, model_matmul_gflops, roofline, unembed_flops

import capinterp as ci
from capinterp.circuits import Graph, acdc
from capinterp.circuits.acdc_layer import slot_layer
from capinterp.core.example import Example
from capinterp.core.tokens import batches, encode

FACTS = [
    Example("Rome is the capital of", " Italy"),
    Example("Berlin is the capital of", " Germany"),
    Example("The Eiffel Tower is in the city of", " Paris"),
    Example("The Colosseum is in the city of", " Rome"),
]


def _flops(model, graph: Graph, items, batch_size: int) -> dict[str, int]:
    """Useful FLOPs of each route over every edge trial (see the module docstring)."""
    d = Dims.of(model)
    layers = [slot_layer(graph, j) for i, j in graph.edge_mask.nonzero().tolist()]
    full = layer = 0
    for chunk in batches(items, batch_size):
        B, T = len(chunk), max(len(it.ids) for it in chunk)
        answers = sum(len(it.answer_positions) for it in chunk)
        whole = forward_flops(d, T, rows=B)
        full += (len(layers) + 2) * whole
        layer += 3 * whole + sum(B * (d.n_layers - l) * block_flops(d, T, T) for l in layers)
        layer += len(layers) * unembed_flops(d, answers)
    return {"full": full, "layer": layer}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", default="2,4", help="comma-separated layer counts of the tiny models")
    ap.add_argument("--threshold", type=float, default=0.01)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    for L in (int(x) for x in args.layers.split(",")):
        model = ci.load_model("tiny", n_layers=L, threads=args.threads)
        graph = Graph.from_model(model)
        res, sec = {}, {}
        for route in ("full", "layer"):
            t = time.perf_counter()
            res[route] = acdc(model, graph, FACTS, threshold=args.threshold, batch_size=args.batch_size, route=route)
            sec[route] = time.perf_counter() - t
        flops = _flops(model, graph, encode(model, FACTS), args.batch_size)
        peak = model_matmul_gflops(model, args.threads)
        print(f"tiny, {L} layers, {graph.n_edges} edges, {len(FACTS)} facts:")
        for route in ("full", "layer"):
            print(f"  {route:5s} route {sec[route]:7.2f} s  {roofline(flops[route], sec[route], peak)}")
        same = bool((res["full"][0] == res["layer"][0]).all())
        diff = float((res["full"][1] - res["layer"][1]).abs().max())
        print(
            f"  full / layer time ratio {sec['full'] / sec['layer']:.2f}x; same kept edges {same}; delta diff {diff:.1e}"
        )


if __name__ == "__main__":
    main()
