"""Coverage of ``ci.certify``'s bounds: seeded trials on populations whose every effect is known.

    python scripts/certify_coverage.py [--trials 500]

Populations: the tiny Llama with three planted neurons (tests/planting.py) whose located set keeps
two of them, every outside neuron's and FFN layer's exact effect computed once by an exhaustive
``certify``; and synthetic populations the size of Gemma 3 270M's 36 864 FFN neurons. Each row runs
``--trials`` seeded draws of the sampling plan and prints the share whose bound held, the mean bound
and the truth (:mod:`capinterp.interventions.certify_coverage`), as a markdown table.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's capinterp, whatever is installed
sys.path.insert(0, str(ROOT / "tests"))  # tests/planting.py


def planted_population():
    """(neuron values, neuron scores, layer values) outside the located sets of the planted tiny model."""
    import numpy as np
    import torch
    from planting import PLANTED, plant

    import capinterp as ci
    from capinterp.data import Example
    from capinterp.interventions.certify import certify

    data = [Example(f"{a}+{b}=", "7") for a, b in [(3, 4), (5, 2), (1, 6), (2, 5), (6, 1), (4, 3)]]
    model = ci.load_model("tiny")
    plant(model, data)
    s = torch.rand(*model.W_in.shape[::2], generator=torch.Generator().manual_seed(0)) * 0.1
    for l, i in PLANTED:
        s[l, i] = 10.0
    scores = ci.NeuronScores(s)
    full = certify(model, scores.top_k(2), data, budget=10**6, scores=scores)
    order = np.argsort([l * s.shape[1] + i for l, i in full.sampled_units])
    x = np.maximum(np.array(full.sampled_effects), 0.0)[order]
    sc = np.array([float(s[l, i]) for l, i in full.sampled_units])[order]
    layers = certify(model, ci.KeySet.layers([1], n_layers=s.shape[0]), data, budget=10**6)
    return x, sc, np.maximum(np.array(layers.sampled_effects), 0.0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=500)
    ap.add_argument("--delta", type=float, default=0.05)
    args = ap.parse_args(argv)
    import numpy as np

    from capinterp.interventions.certify_coverage import coverage, synthetic_population, table

    t, d = args.trials, args.delta
    x, sc, lx = planted_population()
    rows = []
    for tau in (1e-4, 1e-5):
        for budget in (32, 128):
            for strata, top in ((1, 0), (3, 0), (1, budget // 2)):
                row = coverage(x, sc, budget=budget, tau=tau, delta=d, strata=strata, top=top, trials=t)
                rows.append({**row, "setting": "tiny planted neurons"})
    rows.append(coverage(lx, np.zeros(len(lx)), budget=2, tau=1e-3, delta=d, trials=t, setting="tiny planted layers"))
    for hits in (40, 400):
        gx, gs = synthetic_population(36864, hits, 0.05, seed=1)
        for budget in (256, 1024, 4096):
            for strata, top in ((1, 0), (3, 0), (1, budget // 2)):
                row = coverage(gx, gs, budget=budget, tau=0.01, delta=d, strata=strata, top=top, trials=t)
                rows.append({**row, "setting": f"synthetic 36864, {hits} hits"})
    hx, hs = synthetic_population(1000, 30, 0.5, seed=2, informative=False)
    for delta in (d, 0.2):
        rows.append(coverage(hx, hs, budget=100, tau=0.01, delta=delta, trials=t, setting="synthetic tight"))
    frame = table(rows)
    cells = [[f"{v:.4g}" if isinstance(v, float) else str(v) for v in row] for row in frame.itertuples(index=False)]
    for line in [list(frame.columns), ["---"] * len(frame.columns), *cells]:
        print("| " + " | ".join(line) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
