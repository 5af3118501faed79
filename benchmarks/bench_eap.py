"""Benchmark EAP / EAP-IG edge scoring: edges scored per second and peak RSS.

    python benchmarks/bench_eap.py --model smollm2 --threads 1 --facts 2 --steps 1 5 30

"Edges scored per second" = n_edges x n_facts / wall seconds of :func:`score_edges` (all edges of
the graph get a score for every fact). One JSON line per configuration, then a summary table.
Peak RSS is the process's maximum resident set (``ru_maxrss``) after each run, so it only grows.
The 1-minute load average and the process's CPU seconds are recorded too: on a shared machine wall
times scale with the load, CPU seconds much less.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time

from _roofline import Dims, eap_flops, model_matmul_gflops

from capinterp.arch.model import load_model
from capinterp.circuits import Graph, make_pairs, score_edges
from capinterp.core.example import Example

FACTS = [
    Example("The Eiffel Tower is located in the city of", " Paris", {"subject": "The Eiffel Tower"}),
    Example("The Colosseum is located in the city of", " Rome", {"subject": "The Colosseum"}),
    Example("The Brandenburg Gate is located in the city of", " Berlin", {"subject": "The Brandenburg Gate"}),
    Example("The Statue of Liberty is located in the city of", " New", {"subject": "The Statue of Liberty"}),
]


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--threads", type=int, default=1)  # 2 threads on a busy 2-core box: 5-10x slower
    ap.add_argument("--facts", type=int, default=2)
    ap.add_argument("--steps", type=int, nargs="+", default=[1, 5, 30])
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--device", default=None)
    args = ap.parse_args(argv)

    t0 = time.perf_counter()
    model = load_model(args.model, threads=args.threads, device=args.device)
    load_s = time.perf_counter() - t0
    graph = Graph.from_model(model)
    facts = FACTS[: args.facts]
    pairs = make_pairs(model, facts)
    n_tokens = [len(p.clean.ids) for p in pairs]
    print(
        json.dumps(
            {
                "model": args.model,
                "load_s": round(load_s, 2),
                "nodes": len(graph.nodes),
                "edges": graph.n_edges,
                "slots": graph.n_slots,
                "granularity": graph.granularity,
                "tokens": n_tokens,
                "corruption": [p.mode for p in pairs],
                "rss_mb": round(peak_rss_mb()),
            }
        )
    )
    peak = model_matmul_gflops(model, args.threads)  # same threads, dtype and device, this run
    rows = []
    for steps in args.steps:
        t, c = time.perf_counter(), time.process_time()
        scores, info = score_edges(model, graph, pairs, steps=steps, batch_size=args.batch_size)
        sec, cpu = time.perf_counter() - t, time.process_time() - c
        flops = sum(  # per batch of pairs, padded to its longest
            eap_flops(Dims.of(model), max(n_tokens[i : i + args.batch_size]), len(n_tokens[i : i + args.batch_size]),
                      steps, scores.shape[0], graph.n_slots)
            for i in range(0, len(n_tokens), args.batch_size)
        )  # fmt: skip
        row = {
            "method": "eap" if steps == 1 else "eap-ig",
            "steps": steps,
            "facts": len(pairs),
            "seconds": round(sec, 2),
            "cpu_s": round(cpu, 2),
            "edges_per_s": round(graph.n_edges * len(pairs) / sec),
            "s_per_fact": round(sec / len(pairs), 2),
            "peak_rss_mb": round(peak_rss_mb()),
            "loadavg_1m": round(os.getloadavg()[0], 2),
            "gflops_per_s": round(flops / sec / 1e9, 3),
            "pct_of_matmul": round(100 * flops / sec / 1e9 / peak, 2),
        }
        rows.append(row)
        print(json.dumps(row))
    print(f"\n{args.model}: {len(graph.nodes)} nodes, {graph.n_edges} edges, threads={args.threads}")
    print(f"matmul at the model's FFN shape: {peak:.2f} GFLOP/s")
    print(f"{'method':8} {'steps':>5} {'s/fact':>8} {'edges/s':>10} {'peak RSS MB':>12} {'GFLOP/s':>8} {'% matmul':>8}")
    for r in rows:
        print(
            f"{r['method']:8} {r['steps']:>5} {r['s_per_fact']:>8} {r['edges_per_s']:>10} {r['peak_rss_mb']:>12} "
            f"{r['gflops_per_s']:>8} {r['pct_of_matmul']:>7}%"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
