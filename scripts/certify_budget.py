"""What a budget of exact patches buys: ``ci.certify``'s bounds against B on a packaged model.

    python scripts/certify_budget.py --model gemma --facts 8 --budget 256

DCSN (sigma selection) locates neurons on the known builtin facts (up to ``--facts``, one prompt
each); ``certify`` then patches ``--budget`` uniformly drawn neurons outside the located set (zero
ablation). A uniform sample's first b draws are a uniform sample of size b, so the bounds for each
smaller b are read off the same patches. Prints one markdown row per b: the count bound (effects
above ``--tau``), the total bound and the plug-in estimate, at 1 - ``--delta``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's capinterp, whatever is installed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gemma")
    ap.add_argument("--facts", type=int, default=8)
    ap.add_argument("--budget", type=int, default=256)
    ap.add_argument("--tau", type=float, default=0.01)
    ap.add_argument("--delta", type=float, default=0.05)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args(argv)
    import numpy as np

    from capinterp import DCSN, certify
    from capinterp.arch.model import load_model
    from capinterp.data.paraphrases import builtin_paraphrases, known_paraphrases
    from capinterp.interventions.certify_bounds import bounds

    start = time.time()
    model = load_model(args.model, threads=args.threads)
    bags = known_paraphrases(model, builtin_paraphrases(), per_fact=1, min_prompts=1, max_facts=args.facts)
    facts = [b[0] for b in bags]
    dcsn = DCSN(model).fit(facts)
    c = certify(model, dcsn, facts, budget=args.budget, tau=args.tau, delta=args.delta)
    print(f"{args.model}: {len(facts)} facts; {c.summary()}; {time.time() - start:.0f} s")
    x = np.maximum(np.array(c.sampled_effects), 0.0)
    print("| B | count bound | total bound | total estimate |")
    print("| --- | --- | --- | --- |")
    b = 32
    while b <= len(x):
        r = bounds([c.n_outside], [b], [x[:b]], args.tau, args.delta)
        print(f"| {b} | {r.count_bound} | {r.total_bound:.4g} | {r.total_estimate:.4g} |")
        b *= 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
