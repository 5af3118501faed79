"""What a budget of exact patches buys: ``ci.certify``'s bounds against B on a packaged model.

    python scripts/certify_budget.py --model gemma --method dcsn --facts 8 --budget 256
    python scripts/certify_budget.py --model smollm2 --method cnl,kn,tracing,eap-ig --budget 256

Each ``--method`` locates units on its task, then ``certify`` patches ``--budget`` uniformly drawn
units outside the located set (zero ablation):

* ``dcsn``: DCSN (sigma selection) neurons on the known builtin facts (up to ``--facts``, one prompt each);
* ``cnl``: CNL neurons (dataset-level IG, ``--steps`` points) on ``--problems`` ``sub`` problems
  (the arithmetic capability, solved ones first, as the capability experiments pick them);
* ``kn``: KN neurons (IG, ``--steps`` points) of the known facts' prompts;
* ``tracing``: ROME causal tracing's ``--top-layers`` FFN layers (MLP restorations only,
  ``--samples`` noised copies per fact) on the known facts;
* ``eap-ig``: the EAP-IG knowledge circuit's edges (``--top-edges`` kept, ``--steps`` points) on the
  known facts.

A uniform sample's first b draws are a uniform sample of size b, so the bounds for each smaller b
are read off the same patches. Prints, per method, the certificate's line and one markdown row per
b (16, 32, 64, ... doubling below the number patched, from 2 for layers, then the number patched): the count
bound (effects above ``--tau``), the total bound and the plug-in estimate, at 1 - ``--delta``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's capinterp, whatever is installed

METHODS = ("dcsn", "cnl", "kn", "tracing", "eap-ig")
FACT_METHODS = ("dcsn", "kn", "tracing", "eap-ig")


def locate(model: Any, method: str, data: list, *, steps: int = 4, samples: int = 3, layers: int = 3, edges: int = 200):
    """The fitted localizer of ``method`` on ``data`` (progress bars off)."""
    import capinterp as ci

    if method == "dcsn":
        return ci.DCSN(model, progress=False).fit(data)
    if method == "cnl":
        return ci.CNL(model, steps=steps, progress=False).fit(data)
    if method == "kn":
        return ci.KN(model, steps=steps, progress=False).fit(data)
    if method == "tracing":
        trace = ci.CausalTrace(
            model, samples=samples, kinds=("mlp",), top_k=layers, require_correct=False, progress=False
        )
        return trace.fit(data)
    if method == "eap-ig":
        return ci.KnowledgeCircuit(model, algorithm="eap-ig", steps=steps, top_n=edges, progress=False).fit(data)
    raise ValueError(f"unknown method {method!r}; choose from {', '.join(METHODS)}")


def task_data(model: Any, method: str, facts: int, problems: int) -> list:
    """``method``'s data: ``problems`` ``sub`` problems for CNL, else up to ``facts`` known builtin facts."""
    if method == "cnl":
        from capinterp.experiments.capability_data import prepare

        return prepare(model, ["sub"], n_candidates=2 * problems, n_locate=problems, n_test=1)["sub"].locate
    from capinterp.data.paraphrases import builtin_paraphrases, known_paraphrases

    bags = known_paraphrases(model, builtin_paraphrases(), per_fact=1, min_prompts=1, max_facts=facts)
    return [b[0] for b in bags]


def budget_rows(cert: Any) -> list[tuple[int, int, float, float]]:
    """(b, count bound, total bound, total estimate) for b = 16, 32, ... (from 2 for layers) below
    the number patched, then the number patched, from the first b patches of ``cert``'s uniform draw."""
    import numpy as np

    from capinterp.interventions.certify_bounds import bounds

    if len(cert.strata) != 1:
        raise ValueError("budget rows need one uniform stratum (strata=1, top=0)")
    x = np.abs(cert.sampled_effects) if cert.absolute else np.maximum(cert.sampled_effects, 0.0)
    b, sizes = (2 if cert.kind == "layer" else 16), []
    while b < len(x):
        sizes.append(b)
        b *= 2
    rows = []
    for b in [*sizes, len(x)]:
        r = bounds([cert.n_outside], [b], [x[:b]], cert.tau, cert.delta)
        rows.append((b, r.count_bound, r.total_bound, r.total_estimate))
    return rows


def measure(model: Any, method: str, data: list, args: argparse.Namespace) -> Any:
    """Locate with ``method`` on ``data``, then ``certify`` the located set (``args``: the CLI's)."""
    from capinterp import certify

    kw = {"steps": args.steps, "samples": args.samples, "layers": args.top_layers, "edges": args.top_edges}
    found = locate(model, method, data, **kw)
    return certify(model, found, data, budget=args.budget, tau=args.tau, delta=args.delta, batch_size=args.batch_size)


def report(model: Any, method: str, data: list, args: argparse.Namespace, name: str) -> str:
    """The printed block of one method: the certificate's line and the markdown table."""
    start = time.time()
    c = measure(model, method, data, args)
    what = "sub problems" if method == "cnl" else "facts"
    lines = [f"{name} {method}: {len(data)} {what}; {c.summary()}; {time.time() - start:.0f} s", ""]
    lines += ["| B | count bound | total bound | total estimate |", "| --- | --- | --- | --- |"]
    lines += [f"| {b} | {n} | {t:.4g} | {e:.4g} |" for b, n, t, e in budget_rows(c)]
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gemma")
    ap.add_argument("--method", default="dcsn", help=f"comma-separated, of {', '.join(METHODS)}")
    ap.add_argument("--facts", type=int, default=8)
    ap.add_argument("--problems", type=int, default=16)
    ap.add_argument("--budget", type=int, default=256)
    ap.add_argument("--tau", type=float, default=0.01)
    ap.add_argument("--delta", type=float, default=0.05)
    ap.add_argument("--steps", type=int, default=4, help="IG points (CNL, KN, EAP-IG)")
    ap.add_argument("--samples", type=int, default=3, help="causal tracing's noised copies per fact")
    ap.add_argument("--top-layers", type=int, default=3, help="causal tracing's located layers")
    ap.add_argument("--top-edges", type=int, default=200, help="EAP-IG's kept edges")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--threads", type=int, default=None)
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    methods = [m.strip() for m in args.method.split(",") if m.strip()]
    bad = [m for m in methods if m not in METHODS]
    if bad or not methods:
        ap.error(f"unknown method(s) {bad or methods}; choose from {', '.join(METHODS)}")
    from capinterp.arch.model import load_model

    model = load_model(args.model, threads=args.threads)
    facts = task_data(model, "dcsn", args.facts, args.problems) if set(methods) & set(FACT_METHODS) else []
    for method in methods:
        data = facts if method in FACT_METHODS else task_data(model, method, args.facts, args.problems)
        print(report(model, method, data, args, args.model) + "\n", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
