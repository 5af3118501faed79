"""The convergence experiment (split-half consistency against data size) on chosen datasets.

    .venv/bin/python scripts/convergence.py --model gemma3 --tracks sub,emotion --out out/convergence-gemma3

Runs :func:`capinterp.experiments.convergence.run_plan` with the full sizes (25-800 per half,
each track up to its ``max_per_half``, or ``--max-per-half``), 3 splits per size, blocks of 25. Block fits are cached
under ``OUT/cache`` exactly as ``capinterp reproduce --out OUT`` caches them, so an interrupted
run resumes, and a later ``capinterp reproduce --only convergence --out OUT`` reuses every block.
Prints the summary table; writes ``OUT/experiments/convergence/`` (table, figure, info).

    .venv/bin/python scripts/convergence.py --combine gemma3=out/conv-g-sub gemma3=out/conv-g-emotion \
        smollm2=out/conv-s-sub --out out/convergence-all

draws finished runs in one figure (one line per model, dataset and method) and prints their
tables as one markdown table; writes ``OUT/table.csv``, ``OUT/figure.json`` and ``OUT/figure.html``.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

import capinterp as ci
from capinterp.experiments.base import Context, ExperimentResult
from capinterp.experiments.convergence import FULL_PLAN, FULL_SIZES, NAME, combine, convergence_figure, run_plan

MD_HEADER = (
    "| model | dataset | method | per half | overlap % (mean ± sd) | min-max | IoU % | located % of neurons "
    "| s for both halves |\n|---|---|---|---|---|---|---|---|---|"
)


def markdown(table) -> str:
    """The combined summary as a markdown table (percentages to 0.1, located share to 0.001)."""
    lines = [MD_HEADER]
    for r in table.itertuples():
        lines.append(
            f"| {r.model} | {r.dataset} | {r.method.upper()} | {r.n_per_half} | {r.overlap_mean:.1f} ± "
            f"{r.overlap_std:.1f} | {r.overlap_min:.1f}-{r.overlap_max:.1f} | {r.iou_mean:.1f} | "
            f"{r.ratio_pct_mean:.3f} | {r.seconds_per_size:,.0f} |"
        )
    return "\n".join(lines)


def combine_runs(pairs: list[str], out: Path) -> int:
    """``--combine LABEL=DIR ...``: one table and one figure from finished runs."""
    runs = []
    for pair in pairs:
        label, sep, folder = pair.partition("=")
        if not sep or not label or not folder:
            raise SystemExit(f"--combine takes LABEL=DIR, got {pair!r}")
        path = Path(folder) / "experiments"
        if not (path / NAME / "table.csv").is_file():
            raise SystemExit(f"{folder}: no finished convergence run (no {path / NAME / 'table.csv'})")
        runs.append((label, ExperimentResult.load(path, NAME).table))
    table = combine(runs)
    out.mkdir(parents=True, exist_ok=True)
    table.to_csv(out / "table.csv", index=False)
    fig = convergence_figure(table)
    (out / "figure.json").write_text(fig.to_json())
    fig.write_html(out / "figure.html")
    print(markdown(table))
    return 0


def main(argv=None) -> int:
    tracks = {t.label: t for t in FULL_PLAN}
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="gemma3")
    ap.add_argument("--tracks", default=",".join(tracks), help=f"comma-separated, of {', '.join(tracks)}")
    ap.add_argument("--out", required=True)
    ap.add_argument("--combine", nargs="+", metavar="LABEL=DIR", help="combine finished runs instead of running")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--ig-rule", default="papers", choices=("papers", "accurate"))
    ap.add_argument(
        "--max-per-half",
        type=int,
        default=None,
        help="cap every track at this many examples per half (a shorter run; its pool, and so its blocks, differ)",
    )
    args = ap.parse_args(argv)
    if args.combine:
        return combine_runs(args.combine, Path(args.out))
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
