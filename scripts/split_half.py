"""Split-half consistency of capability neurons per operator (Huang et al. 2025, Table 1).

    .venv/bin/python scripts/split_half.py --model gemma3 --n 60 --methods cnl,dcsn --out split.csv

For each operator: generate single-digit DG problems, keep those the model answers correctly
(the capability it has), split them into two random halves, localize each half, and report
overlap (|A∩B|/min), IoU and ratio (share of FFN neurons).
"""

from __future__ import annotations

import argparse
import time

import pandas as pd

import capinterp as ci


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="gemma3")
    ap.add_argument("--ops", default="+-*/")
    ap.add_argument("--n", type=int, default=60)
    ap.add_argument("--methods", default="cnl,dcsn")
    ap.add_argument("--sigma", type=float, default=6.0)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    model = ci.load_model(args.model, threads=args.threads)
    rows = []
    for op in args.ops:
        ds = ci.data.arithmetic(ops=op, n=args.n, seed=args.seed + 100)
        ev = ci.evaluate(model, ds, progress=False)
        right = [e for e, r in zip(ds, ev.records) if r["correct"]]
        for method in args.methods.split(","):
            kw = {"steps": args.steps} if method == "cnl" else {}
            loc = ci.localizers.get(method)(model, sigma=args.sigma, progress=False, **kw)
            t = time.time()
            res = loc.split_half(right, seed=args.seed)
            rows.append(
                {
                    "model": args.model,
                    "op": op,
                    "method": method,
                    "accuracy": ev.accuracy,
                    "n_correct": len(right),
                    **res,
                    "seconds": round(time.time() - t, 1),
                }
            )
            print(rows[-1], flush=True)
    df = pd.DataFrame(rows)
    if args.out:
        df.to_csv(args.out, index=False)
    print(df.to_string(index=False))


if __name__ == "__main__":
    main()
