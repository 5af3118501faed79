"""Benchmark ROME causal tracing: restorations per second, the routes side by side, and peak RSS.

    CAPINTERP_THREADS=1 python benchmarks/bench_trace.py --threads 1          # SmolLM2, resid+mlp+attn
    CAPINTERP_THREADS=1 python benchmarks/bench_trace.py --threads 1 --quick  # the tiny model

Modes (each runs in its own subprocess, so its peak RSS is its own):

* ``one``: ROME's loop -- one restoration per forward pass (a batch of ``samples`` corrupted
  copies; ``batch_size = samples``), full sequences;
* ``batched``: restorations x samples stacked into batches of ``--batch-size`` rows, per-row hooks,
  full sequences;
* ``batched+prefix``: as ``batched``, and restorations at token t run only positions t..T-1 over
  the corrupted prefix's KV cache (the route before the stair);
* ``stair``: the default of :class:`capinterp.CausalTrace`: as ``batched+prefix``, and each
  restoration row starts at its window's first layer from the corrupted run's recorded residual
  (:mod:`capinterp.kernels._trace_stair`); the layers below it are not run again.

Each mode runs with the model's parameters frozen (``requires_grad=False``) and trainable (as
loaded), unless ``--params`` picks one; the last table puts the old route (``batched+prefix``)
beside the stair: their time ratio, measured in this one run.

"Restorations" = (tokens from the first subject token on) x layers x kinds, summed over facts
(each one is ``samples`` forward rows). The summary gives restorations per wall second and per CPU
second of the process (steadier on a shared machine), the speed-ups over ``one``,
the peak RSS, and the largest grid difference from the first mode (the modes compute the same
numbers). Facts are the builtin facts the model knows (:func:`builtin_facts` + ``facts_known_by``).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

MODES = {
    "one": dict(reuse_prefix=False, one_at_a_time=True, stair=False),
    "batched": dict(reuse_prefix=False, one_at_a_time=False, stair=False),
    "batched+prefix": dict(reuse_prefix=True, one_at_a_time=False, stair=False),
    "stair": dict(reuse_prefix=True, one_at_a_time=False, stair=True),
}
PARAMS = ("frozen", "trainable")


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


def run_mode(args) -> dict:
    import torch

    from capinterp.arch.model import load_model
    from capinterp.data.facts import builtin_facts, facts_known_by
    from capinterp.localizers.causal_trace import CausalTrace

    t0 = time.perf_counter()
    model = load_model(args.model, threads=args.threads, device=args.device)
    for p in model.parameters():
        p.requires_grad_(args.params == "trainable")
    load_s = time.perf_counter() - t0
    facts = builtin_facts()
    if args.model.startswith("tiny"):  # a random model knows nothing: trace its own answers
        facts = [f.__class__(f.prompt, "", {**f.meta, "target_from": "greedy"}) for f in facts]
    else:
        facts = facts_known_by(model, facts)
    facts = facts[: args.facts]
    mode = MODES[args.mode]
    bs = args.samples if mode["one_at_a_time"] else args.batch_size
    tr = CausalTrace(
        model,
        samples=args.samples,
        kinds=tuple(args.kinds),
        window=args.window,
        reuse_prefix=mode["reuse_prefix"],
        batch_size=bs,
        progress=False,
        top_k=min(3, model.cfg.n_layers),
        layer_kind=args.kinds[0],
    )
    tr._stair = mode["stair"]  # private switch: False keeps the bridge route
    t, c = time.perf_counter(), time.process_time()
    tr.fit(facts)
    sec, cpu = time.perf_counter() - t, time.process_time() - c
    L = model.cfg.n_layers
    n_rest = sum((len(r["tokens"]) - r["subject_range"][0]) * L * len(tr.kinds) for r in tr.per_prompt_)
    grids = {k: torch.cat([r["grids"][k].flatten() for r in tr.per_prompt_]).tolist() for k in tr.kinds}
    flops, peak = _roofline_of(model, tr, args)
    return {
        "mode": args.mode,
        "params": args.params,
        "model": args.model,
        "facts": tr.n_traced_,
        "skipped": tr.skipped_,
        "tokens": [len(r["tokens"]) for r in tr.per_prompt_],
        "kinds": list(tr.kinds),
        "samples": args.samples,
        "batch_size": bs,
        "threads": args.threads,
        "load_s": round(load_s, 2),
        "seconds": round(sec, 2),
        "cpu_seconds": round(cpu, 2),
        "s_per_fact": round(sec / max(1, tr.n_traced_), 2),
        "restorations": n_rest,
        "restorations_per_s": round(n_rest / sec, 2),
        "restorations_per_cpu_s": round(n_rest / cpu, 2),
        "peak_rss_mb": round(peak_rss_mb()),
        "gflops_per_s": round(flops / sec / 1e9, 3),
        "matmul_gflops_per_s": round(peak, 2),
        "pct_of_matmul": round(100 * flops / sec / 1e9 / peak, 2),
        "top_layers": tr.layers_,
        "p_clean": [round(r["p_clean"], 4) for r in tr.per_prompt_],
        "p_corrupt": [round(r["p_corrupt"], 4) for r in tr.per_prompt_],
        "grids": grids,
    }


def block_positions(T: int, s0: int, L: int, S: int, window: int, kinds: list[str]) -> dict[str, int]:
    """Block x position evaluations of one fact per route, counted from the shapes each runs (the
    layers' work; attention over at most T keys and the last-position unembedding aside).

    ROME's loop: every (token, layer) restoration runs S + 1 rows (a clean one too) over all T positions
    and all L blocks. batched+prefix: restorations from the first subject token s0 on, S rows over the
    T - t positions from t, all L blocks, plus the corrupted run. stair: as that, but each row from its
    window's first layer, plus, per token t, the recorded prefix and suffix runs and the check.
    """
    half = window // 2
    first = {"resid": lambda l: l, "mlp": lambda l: max(0, l - half), "attn": lambda l: max(0, l - half)}
    k, ts = len(kinds), range(s0, T)
    rome = T * L * k * (S + 1) * T * L
    old = sum(S * (T - t) * L * L * k for t in ts) + S * T * L
    rows = sum(S * (T - t) * (L - first[kind](l)) for t in ts for kind in kinds for l in range(L))
    stair = rows + sum(S * t * L + 2 * S * (T - t) * L for t in ts) + S * T * L
    return {"rome_loop": rome, "batched+prefix": old, "stair": stair}


def _roofline_of(model, tr, args) -> tuple[int, float]:
    """(useful FLOPs of this mode's fit, counted from :func:`block_positions`; a dense matmul's GFLOP/s
    at the same threads, dtype and device, measured now): see ``benchmarks/_roofline.py``."""
    from _roofline import Dims, model_matmul_gflops, trace_flops

    d, flops = Dims.of(model), 0
    for r in tr.per_prompt_:
        T, s0, L = len(r["tokens"]), r["subject_range"][0], d.n_layers
        n = block_positions(T, s0, L, args.samples, args.window, list(tr.kinds))
        n["batched"] = (T - s0) * L * len(tr.kinds) * args.samples * T * L + args.samples * T * L
        n["one"] = n["rome_loop"]
        flops += trace_flops(d, n[args.mode], T)
    return flops, model_matmul_gflops(model, args.threads)


def _work(args) -> int:
    """Print :func:`block_positions` for the facts the benchmark would trace (no tracing)."""
    from capinterp.arch.model import load_model
    from capinterp.data.facts import builtin_facts, facts_known_by
    from capinterp.localizers.causal_trace import CausalTrace

    model = load_model(args.model, threads=args.threads, device=args.device)
    facts = builtin_facts()
    if args.model.startswith("tiny"):
        facts = [f.__class__(f.prompt, "", {**f.meta, "target_from": "greedy"}) for f in facts]
    else:
        facts = facts_known_by(model, facts)
    tr = CausalTrace(model, samples=args.samples, window=args.window, kinds=tuple(args.kinds), progress=False)
    L = int(model.cfg.n_layers)
    for i, ex in enumerate(facts[: args.facts]):
        item = tr._prepare(i, ex)
        T, s0 = len(item["ids"]), item["subject_range"][0]
        n = block_positions(T, s0, L, args.samples, args.window, list(args.kinds))
        ratios = {k: round(v / n["stair"], 2) for k, v in n.items()}
        print(json.dumps({"prompt": ex.prompt, "T": T, "s0": s0, "L": L, "block_positions": n, "over_stair": ratios}))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--facts", type=int, default=1)
    ap.add_argument("--kinds", nargs="+", default=["resid", "mlp", "attn"])
    ap.add_argument("--samples", type=int, default=10)
    ap.add_argument("--window", type=int, default=10)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--modes", nargs="+", default=["batched+prefix", "stair"], choices=list(MODES))
    ap.add_argument("--params", nargs="+", default=list(PARAMS), choices=PARAMS)
    ap.add_argument("--quick", action="store_true", help="the tiny model, 3 samples, window 3")
    ap.add_argument("--device", default=None)
    ap.add_argument("--work", action="store_true", help="print each route's block x position count; no tracing")
    ap.add_argument("--mode", default=None, help=argparse.SUPPRESS)  # internal: run one mode, print JSON
    args = ap.parse_args(argv)
    if args.quick:
        args.model, args.samples, args.window = "tiny", 3, 3
    if args.work:
        return _work(args)
    if args.mode:
        args.params = args.params[0]
        print("RESULT " + json.dumps(run_mode(args)))
        return 0

    results = []
    for params in args.params:
        for mode in args.modes:
            cmd = [sys.executable, __file__, "--mode", mode, "--params", params, *_forward(args)]
            out = subprocess.run(cmd, capture_output=True, text=True)
            line = next((l for l in out.stdout.splitlines() if l.startswith("RESULT ")), None)
            if out.returncode or line is None:
                print(out.stdout[-2000:], out.stderr[-4000:], file=sys.stderr)
                return 1
            res = json.loads(line[len("RESULT ") :])
            results.append(res)
            print(json.dumps({k: v for k, v in res.items() if k != "grids"}), flush=True)
    _table(results)
    _side_by_side(results)
    return 0


def _table(results: list[dict]) -> None:
    base = results[0]
    print(
        f"\n{'mode':16s} {'params':9s} {'s/fact':>8s} {'restor/s':>9s} {'speed-up':>9s} {'restor/cpu-s':>12s} "
        f"{'cpu speed-up':>12s} {'peak MB':>8s} {'max|dIE|':>9s} {'GFLOP/s':>8s} {'% matmul':>8s}  top layers"
    )
    for r in results:
        diff = max((abs(a - b) for k in r["grids"] for a, b in zip(r["grids"][k], base["grids"][k])), default=0.0)
        print(
            f"{r['mode']:16s} {r['params']:9s} {r['s_per_fact']:8.2f} {r['restorations_per_s']:9.2f} "
            f"{r['restorations_per_s'] / base['restorations_per_s']:8.2f}x {r['restorations_per_cpu_s']:12.2f} "
            f"{r['restorations_per_cpu_s'] / base['restorations_per_cpu_s']:11.2f}x {r['peak_rss_mb']:8d} "
            f"{diff:9.1e} {r['gflops_per_s']:8.2f} {r['pct_of_matmul']:7.1f}%  {r['top_layers']}"
        )


def _side_by_side(results: list[dict]) -> None:
    """Old route (batched+prefix) beside the stair, per parameter setting: seconds and their ratio."""
    by = {(r["mode"], r["params"]): r for r in results}
    rows = [p for p in PARAMS if ("batched+prefix", p) in by and ("stair", p) in by]
    if not rows:
        return
    print(
        f"\n{'params':9s} {'old s':>8s} {'stair s':>8s} {'old/stair':>9s} {'old cpu-s':>9s} {'stair cpu-s':>11s} {'ratio':>6s}"
    )
    for p in rows:
        old, new = by[("batched+prefix", p)], by[("stair", p)]
        print(
            f"{p:9s} {old['seconds']:8.2f} {new['seconds']:8.2f} {old['seconds'] / new['seconds']:8.2f}x "
            f"{old['cpu_seconds']:9.2f} {new['cpu_seconds']:11.2f} {old['cpu_seconds'] / new['cpu_seconds']:5.2f}x"
        )


def _forward(args) -> list[str]:
    out = [
        "--model",
        args.model,
        "--threads",
        str(args.threads),
        "--facts",
        str(args.facts),
        "--kinds",
        *args.kinds,
        "--samples",
        str(args.samples),
        "--window",
        str(args.window),
        "--batch-size",
        str(args.batch_size),
    ]
    return out + (["--device", args.device] if args.device else [])


if __name__ == "__main__":
    sys.exit(main())
