"""Rows of the ``faithfulness`` experiment's quick variant for localizers it runs only in full mode.

The quick reproduction keeps one ranking per kind of localizer (CI time); this script adds other
localizers' rows with exactly the quick variant's data and settings (the same tasks, facts,
sizes, random sets, IG points), for the docs' per-localizer tables:

    python scripts/faithfulness_rows.py --model smollm2 --facts sig,amig --arithmetic kn,sig,amig

prints the rows as CSV (the experiment's columns). Scores are cached under ``--out`` (rerun resumes).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's capinterp, whatever is installed

from capinterp.experiments import faithfulness as FX
from capinterp.experiments.base import Context


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gemma3", help="gemma3, smollm2, tiny, a folder, or a TL name")
    ap.add_argument("--facts", default="", help="comma-separated localizers to rank on the facts")
    ap.add_argument("--arithmetic", default="", help="comma-separated localizers to rank on the sub problems")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", default=None, help="cache folder for fitted scores")
    args = ap.parse_args(argv)
    from capinterp import localizers
    from capinterp.arch.model import load_model

    known = set(localizers.available()) | {"query_localization"}
    facts_m = tuple(m for m in args.facts.split(",") if m)
    arith_m = tuple(m for m in args.arithmetic.split(",") if m)
    bad = [m for m in facts_m + arith_m if m not in known]
    if bad or not (facts_m or arith_m):
        ap.error(f"unknown or no localizers {bad}; choose from {sorted(known)}")
    if "causal_trace" in arith_m or "knowledge_circuit" in arith_m or "query_localization" in arith_m:
        ap.error("causal_trace, knowledge_circuit and query_localization need facts (subjects, paraphrases)")
    t0 = time.perf_counter()
    ctx = Context(load_model(args.model, threads=args.threads), quick=True, workdir=args.out)
    sub, facts = FX.sub_and_facts(ctx, 4)
    tasks: dict = {}
    if arith_m:
        tasks["arithmetic (sub)"] = (sub.locate[: FX.QUICK_LOCATE], sub.test[: FX.QUICK_PROBLEMS], arith_m)
    bags = {}
    if facts_m and facts:
        tasks["facts"] = (facts, facts, facts_m)
        bags["facts"] = FX.paraphrase_bags(ctx, facts, 2)
    table = FX.faithfulness_table(ctx, tasks, bags)
    table.to_csv(sys.stdout, index=False)
    print(f"# {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
