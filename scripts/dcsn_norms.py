"""DCSN with the raw projection vs norms folded in (the DCSN paper's cohesion and separability).

    .venv/bin/python scripts/dcsn_norms.py --model gemma3 --n 50

For each projection, per operator and condition: DCSN scores on the examples the model answers
right (greedy first token), sigma-masked. Prints, per projection: the share of located neurons
in layer 0, cohesion (|A∩B| / max) of "+"'s set across a resample, formats and languages, and
separability between operators (mean over the 6 pairs) in each condition.
"""

from __future__ import annotations

import argparse
import itertools
import time

import pandas as pd

import capinterp as ci
from capinterp.experiments.dcsn_common import OPS, direct_scorer, operator_neurons

CONDITIONS = {  # name -> arithmetic() arguments
    "DG": {},
    "DG-resample": {"seed_offset": 1},
    "TF": {"fmt": "TF"},
    "worded-en": {"style": "fewshot", "shots": 1},
    "worded-zh": {"lang": "zh", "style": "fewshot", "shots": 1},
}
COHESION = [("DG", "DG-resample"), ("DG", "TF"), ("worded-en", "worded-zh"), ("DG", "worded-en")]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="gemma3")
    ap.add_argument("--n", type=int, default=50)
    ap.add_argument("--sigma", type=float, default=6.0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    model = ci.load_model(args.model, threads=args.threads)
    rows = []
    for norms in ("raw", "fold"):
        t0 = time.time()
        scorer = direct_scorer(model, norms=norms)
        sets = {}
        for cond, kw in CONDITIONS.items():
            kw = dict(kw)
            seed = args.seed + kw.pop("seed_offset", 0)
            sets[cond] = operator_neurons(scorer, args.n, seed, sigma=args.sigma, **kw)[1]
        everything = [s for by_op in sets.values() for s in by_op.values()]
        row = {
            "norms": norms,
            "seconds": round(time.time() - t0),
            "mean_size": sum(len(s) for s in everything) / len(everything),
            "layer0_pct": 100
            * sum(sum(1 for l, _ in s if l == 0) for s in everything)
            / max(1, sum(len(s) for s in everything)),
        }
        for a, b in COHESION:
            row[f"coh {a}/{b}"] = 100 * ci.metrics.cohesion(sets[a]["+"], sets[b]["+"])
        for cond in CONDITIONS:
            pairs = list(itertools.combinations(OPS, 2))
            row[f"sep {cond}"] = (
                100 * sum(ci.metrics.separability(sets[cond][x], sets[cond][y]) for x, y in pairs) / len(pairs)
            )
        rows.append(row)
        print(f"{norms}: {row['seconds']} s", flush=True)
    print(pd.DataFrame(rows).set_index("norms").T.round(1).to_string())


if __name__ == "__main__":
    main()
