"""Measure greedy accuracy of packaged models on generated arithmetic: model x op x fmt x digits.

    .venv/bin/python scripts/accuracy_table.py --models smollm2,gemma3 --n 40 --out docs/accuracy.csv

Prints a markdown table (docs/models.md holds the last measured one).
"""

from __future__ import annotations

import argparse
import time

import pandas as pd

import capinterp as ci


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="smollm2,gemma3")
    ap.add_argument("--ops", default="+-*/")
    ap.add_argument("--fmts", default="DG,MQ,TF")
    ap.add_argument("--digits", default="1,2")
    ap.add_argument("--styles", default="compact")
    ap.add_argument("--n", type=int, default=40)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    rows = []
    for name in args.models.split(","):
        model = ci.load_model(name, threads=args.threads)
        for style in args.styles.split(","):
            for fmt in args.fmts.split(","):
                for digits in map(int, args.digits.split(",")):
                    for op in args.ops:
                        ds = ci.data.arithmetic(ops=op, n=args.n, fmt=fmt, digits=digits, style=style, seed=1)
                        t = time.time()
                        r = ci.evaluate(model, ds, batch_size=20, progress=False)
                        rows.append(
                            dict(
                                model=name,
                                style=style,
                                fmt=fmt,
                                digits=digits,
                                op=op,
                                accuracy=r.accuracy,
                                mean_prob=r.mean_prob,
                                n=r.n,
                                seconds=round(time.time() - t, 1),
                            )
                        )
                        print(rows[-1], flush=True)
    df = pd.DataFrame(rows)
    if args.out:
        df.to_csv(args.out, index=False)
    table = df.pivot_table(index=["model", "style", "fmt", "digits"], columns="op", values="accuracy")
    print((100 * table).round(0).to_string())


if __name__ == "__main__":
    main()
