"""How far half-precision scores are from float32 ones, per method, on a packaged model.

    .venv/bin/python benchmarks/bench_precision.py --model smollm2 --n 4 --steps 20 --threads 1

Loads the model twice (float32 and ``--dtype``, bfloat16 by default), runs CNL (integrated
gradients, ``--steps`` points), DCSN and KN-style per-example IG on the same arithmetic
prompts, and prints per method: top-100 overlap of |score| (out of 100), max error relative
to the largest |float32 score|, Pearson correlation, located-set IoU, and wall time of both.
Scores are accumulated in float32 / float64 in both runs; only the forward/backward runs in
half precision.
"""

from __future__ import annotations

import argparse
import time

import torch

import capinterp as ci


def compare(a: torch.Tensor, b: torch.Tensor, k: int = 100) -> dict[str, float]:
    """``a`` float32 reference, ``b`` half-precision run: top-k overlap, max rel error, correlation."""
    ta = set(a.abs().flatten().topk(k).indices.tolist())
    tb = set(b.abs().flatten().topk(k).indices.tolist())
    rel = float((a - b).abs().max() / a.abs().max())
    corr = float(torch.corrcoef(torch.stack([a.flatten(), b.flatten()]).double())[0, 1])
    return {"top100_overlap": len(ta & tb), "max_rel_err": rel, "pearson": corr}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--methods", default="cnl,dcsn")
    args = ap.parse_args()
    ds = ci.data.arithmetic(ops="+", n=args.n, seed=0)
    runs: dict[str, dict[str, tuple]] = {}
    for dtype in ("float32", args.dtype):
        model = ci.load_model(args.model, dtype=dtype, threads=args.threads)
        for method in args.methods.split(","):
            kw = {"steps": args.steps} if method == "cnl" else {}
            t = time.perf_counter()
            loc = ci.localizers.get(method)(model, progress=False, **kw).fit(ds)
            runs.setdefault(method, {})[dtype] = (loc.scores_[:].clone(), loc.neurons_, time.perf_counter() - t)
        del model
    print(f"model {args.model}, {args.n} arithmetic prompts, float32 vs {args.dtype}")
    for method, r in runs.items():
        (a, na, ta), (b, nb, tb) = r["float32"], r[args.dtype]
        c = compare(a, b)
        iou = ci.units.metrics.iou(na, nb, across_models=True) if len(na) + len(nb) else 1.0
        print(
            f"{method:5s} top-100 overlap {c['top100_overlap']:3d}/100  max rel err {c['max_rel_err']:.4f}  "
            f"pearson {c['pearson']:.5f}  located IoU {iou:.3f} ({len(na)} vs {len(nb)})  "
            f"time fp32 {ta:.1f}s  {args.dtype} {tb:.1f}s"
        )


if __name__ == "__main__":
    main()
