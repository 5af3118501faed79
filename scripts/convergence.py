"""The convergence experiment (split-half consistency against data size) on chosen datasets.

    .venv/bin/python scripts/convergence.py --model gemma3 --tracks sub,emotion --out out/convergence-gemma3

Runs :func:`capinterp.experiments.convergence.run_plan` with the full sizes (25-800 per half,
each track up to its ``max_per_half``, or ``--max-per-half``), 3 splits per size, blocks of 25. Block fits are cached
under ``OUT/cache`` exactly as ``capinterp reproduce --out OUT`` caches them, so an interrupted
run resumes, and a later ``capinterp reproduce --only convergence --out OUT`` reuses every block.
Prints the summary table; writes ``OUT/experiments/convergence/`` (table, figure, info).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

import capinterp as ci
from capinterp.experiments.base import Context
from capinterp.experiments.convergence import FULL_PLAN, FULL_SIZES, run_plan


def main(argv=None) -> int:
    tracks = {t.label: t for t in FULL_PLAN}
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="gemma3")
    ap.add_argument("--tracks", default=",".join(tracks), help=f"comma-separated, of {', '.join(tracks)}")
    ap.add_argument("--out", required=True)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--ig-rule", default="papers", choices=("papers", "accurate"))
    ap.add_argument(
        "--max-per-half",
        type=int,
        default=None,
        help="cap every track at this many examples per half (a shorter run; its pool, and so its blocks, differ)",
    )
    args = ap.parse_args(argv)
    unknown = [t for t in args.tracks.split(",") if t not in tracks]
    if unknown:
        ap.error(f"unknown track(s) {unknown}; choose from {', '.join(tracks)}")
    plan = [tracks[t] for t in args.tracks.split(",")]
    if args.max_per_half is not None:
        if args.max_per_half < min(FULL_SIZES):
            ap.error(f"--max-per-half must be at least {min(FULL_SIZES)}")
        plan = [replace(t, max_per_half=min(t.max_per_half, args.max_per_half)) for t in plan]
    torch.set_num_threads(args.threads)
    model = ci.load_model(args.model, threads=args.threads)
    out = Path(args.out)
    ctx = Context(model, workdir=out / "cache", progress=True, ig_rule=args.ig_rule)
    t0 = time.perf_counter()
    res = run_plan(ctx, plan, FULL_SIZES, block=25, n_splits=3)
    res.save(out / "experiments")
    print(res.table.to_string(index=False))
    print(f"first size per half reaching 90 % overlap: {res.info['first_size_reaching_90pct_overlap']}")
    print(f"wall time {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
