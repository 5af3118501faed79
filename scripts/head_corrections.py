"""Per-head attribution corrections on a real model: AtP, RelP and AtP*'s QK fix against exact patching.

    CAPINTERP_DATA=... CAPINTERP_THREADS=1 .venv/bin/python scripts/head_corrections.py --model gemma3 --out DIR

The data are those of ``capinterp reproduce --quick --only patching_agreement`` (the ``sub``
capability's quick locate set, and the builtin facts the model knows, same sizes and seed), so the
AtP and RelP rows repeat that run's and the QK fix row is new. The QK fix costs one forward per
(head, later layer) and batch, which is why the quick reproduction leaves it out. ``--rule-ablation``
adds RelP with subsets of its rules (:data:`capinterp.circuits.relp.RELP_RULES`). Writes
``DIR/head_corrections.csv`` (the head table's columns plus the seconds each method took) and prints it.
"""

from __future__ import annotations

import argparse
import functools
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

import capinterp as ci
from capinterp.circuits.head_patching import head_atp, head_atp_qk, head_effects
from capinterp.circuits.relp import head_relp
from capinterp.experiments.base import Context
from capinterp.experiments.faithfulness import sub_and_facts
from capinterp.experiments.patching_agreement import correlations


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="gemma3")
    ap.add_argument("--out", required=True)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--no-qk", action="store_true", help="leave the QK fix out (AtP and RelP only)")
    ap.add_argument("--tasks", default="sub,facts", help="comma-separated: sub, facts (default both)")
    ap.add_argument("--rule-ablation", action="store_true", help="also RelP with each rule alone and all but one")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model = ci.load_model(args.model, threads=args.threads)
    ctx = Context(model, quick=True, workdir=out / "cache")
    sub, facts = sub_and_facts(ctx, ctx.size(4, 12))
    tasks = {"arithmetic (sub)": sub.locate[: ctx.size(4, 16)]}
    if facts:
        tasks["facts"] = facts
    wanted = {"sub": "arithmetic (sub)", "facts": "facts"}
    keep = [wanted[t] for t in args.tasks.split(",")]
    tasks = {k: v for k, v in tasks.items() if k in keep}
    methods: dict[str, Callable[..., np.ndarray]] = {"AtP": head_atp, "RelP": head_relp}
    if args.rule_ablation:
        for rules in (("ln",), ("attn",), ("act", "half"), ("act", "half", "attn"), ("ln", "act", "half")):
            methods[f"RelP ({'+'.join(rules)})"] = functools.partial(head_relp, rules=rules)
    if not args.no_qk:
        methods["AtP* (QK fix)"] = head_atp_qk
    rows = []
    for task, data in tasks.items():
        t0 = time.perf_counter()
        exact = head_effects(model, data).ravel()
        print(f"{task}: {len(data)} examples, exact per-head patching {time.perf_counter() - t0:.0f} s", flush=True)
        for name, fn in methods.items():
            t0 = time.perf_counter()
            scores = fn(model, data).ravel()
            seconds = time.perf_counter() - t0
            pearson, spearman = correlations(scores, exact)
            rows.append(
                {
                    "task": task,
                    "component": "attention head",
                    "method": name,
                    "pearson": pearson,
                    "spearman": spearman,
                    "n_units": len(exact),
                    "ablation": "zero",
                    "seconds": round(seconds, 1),
                }
            )
            print(rows[-1], flush=True)
    table = pd.DataFrame(rows)
    table.to_csv(out / "head_corrections.csv", index=False)
    print(table.round(3).to_string(index=False))


if __name__ == "__main__":
    main()
