"""IG at equal accuracy: capinterp's adaptive rule against captum's ``IntegratedGradients`` (issue 30).

    PYTHONPATH=. .venv/bin/python benchmarks/bench_ig_accuracy.py --models smollm2,gemma3 --n 10 --threads 1

Side by side in one run, per model, over ``--n`` prompts of
``ci.data.arithmetic(ops="+", n=N, fmt="DG", lang="en", seed=5)`` (KN's setting: the last prompt
token scaled, F = p(first answer token), zero baseline, every neuron of every layer):

* reference: capinterp's Gauss-Legendre with ``--ref-steps`` (200) nodes, node by node;
* ``adaptive``: ``ig_scores`` with ``IGConfig(rule="adaptive", tol=--tol)`` (1e-3), all layers, timed;
* fixed rules (errors only): Gauss-Legendre 5 / 10 / 20 / 40 and the papers' right-20;
* ``captum-50``: captum's ``IntegratedGradients`` at its default (Gauss-Legendre, 50 steps) on
  the activation of one layer (:func:`bench_scale.captum_neuron_ig`), timed on ``--captum-layers``
  (default: first, middle, last) and scaled by ``n_layers / k`` to all layers;
* ``captum-eq``: the same with, per layer, the rule the adaptive rule ended with on that prompt
  (same alphas and weights: the same accuracy, which the run checks; Gauss-Legendre through
  captum's public ``attribute`` for the doubling schedule, the graded composite rule through
  ``IntegratedGradients._attribute(step_sizes_and_alphas=...)``, which ``attribute`` calls per
  batch), timed per point on the captum layers and scaled by all layers' adaptive nodes; and, for
  the doubling schedule, since captum takes one ``n_steps`` for every layer, its time with the most
  nodes any layer needed.

``--no-reference`` skips the reference and the fixed rules (the costly part besides captum): the
adaptive rule's own final error estimates are printed instead, and captum's errors are against
the adaptive rule's scores. The affordable equal-accuracy run (captum on the middle layer only):

    PYTHONPATH=. .venv/bin/python benchmarks/bench_ig_accuracy.py --models smollm2 --n 10 --no-reference --captum-layers 15 --threads 1

Per layer it prints the relative L2 error of each method's scores against the reference (max
over prompts) and the adaptive rule's nodes (mean, max); then the time per prompt and the
ratios captum / adaptive. Errors of captum are measured on the captum layers only.

``--adaptive-only`` runs only the adaptive rule, once per schedule of ``--schedules``
(``auto``: the default; ``graded``: composite Gauss-Legendre graded towards 0; ``doubling``: Gauss-Legendre doubled from 4;
:mod:`capinterp.kernels.adaptive`), and prints per layer the nodes used, the final error estimate and
the completeness error of each, the relative L2 difference between the schedules' scores, and the
time of each (issue 30):

    PYTHONPATH=. .venv/bin/python benchmarks/bench_ig_accuracy.py --models gemma3 --n 1 --adaptive-only --threads 1

``--shape LAYERS`` (comma-separated) prints instead, per layer on the first prompt, the integrand's
shape along the path: F(alpha a) and ``a . dF/da(alpha a)`` (summed over neurons) for alpha from 1
down to 1e-4 and 0, and ``alpha_c = sqrt(eps / ms(W_out a))`` (meaningful only with a post-FFN norm); ``--models tiny_hf:gemma3_text``
takes a tiny random model of that family (:func:`capinterp.arch.tiny.tiny_hf`).
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_scale import captum_neuron_ig

FIXED = [("gauss", 5), ("gauss", 10), ("gauss", 20), ("gauss", 40), ("right", 20)]


def rel(a: torch.Tensor, ref: torch.Tensor) -> float:
    return float((a.double() - ref.double()).norm() / ref.double().norm().clamp_min(1e-30))


def adaptive_rule(n_nodes: int, schedule: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(alphas, weights) of the adaptive rule's round that has ``n_nodes`` nodes under ``schedule``
    (``"graded"`` or ``"doubling"``: :func:`capinterp.kernels.adaptive.rule_of`)."""
    from capinterp.kernels.adaptive import rule_of
    from capinterp.kernels.quadrature import graded, quadrature

    for r in range(16):
        levels, per_level, growth = rule_of(r, schedule)
        alphas, weights = graded(levels, per_level, growth=growth) if levels else quadrature(per_level, "gauss")
        if len(alphas) == n_nodes:
            return alphas, weights
        if len(alphas) > n_nodes:
            break
    raise ValueError(f"no round of the {schedule} schedule has {n_nodes} nodes")


def run_model(name: str, args) -> None:
    import capinterp as ci
    import capinterp.kernels.adaptive as adaptive
    from capinterp.core.tokens import encode
    from capinterp.kernels.ig import ig_scores
    from capinterp.kernels.ig_config import IGConfig
    from capinterp.kernels.invariant import scale_invariant

    model = load(name)
    L = model.cfg.n_layers
    cap_layers = [int(x) for x in args.captum_layers.split(",")] if args.captum_layers else sorted({0, L // 2, L - 1})
    # the schedule rule="adaptive" takes here (zero baseline): graded on a scale-invariant FFN output
    schedule = adaptive.SCHEDULE
    if schedule == "auto":
        schedule = "graded" if scale_invariant(model) else "doubling"
    data = ci.data.arithmetic(ops="+", n=args.n, fmt="DG", lang="en", seed=5)
    items = encode(model, list(data)[: args.n], max_target_tokens=1)
    cfg = IGConfig(positions="last_prompt", batch_size=args.batch_size, invariance="off")
    err: dict[str, list[list[float]]] = {}
    nodes: list[list[float]] = []
    t = {"adaptive": 0.0, "captum-50": 0.0, "captum-eq": 0.0, "eq_nodes": 0.0, "eq_nodes_all": 0.0, "rows": 0.0}
    ig_scores(model, items[0], cfg.replace(steps=1))  # the route's once-per-model check, outside the timings
    captum_neuron_ig(model, items[0], 1, cap_layers[0])  # captum's first call, outside the timings
    for i, it in enumerate(items):
        ref = None if args.no_reference else ig_scores(model, it, cfg.replace(steps=args.ref_steps, rule="gauss"))[0]
        stats: dict = {}
        t0 = time.perf_counter()
        ada = ig_scores(model, it, cfg.replace(rule="adaptive", tol=args.tol, max_steps=args.max_steps), stats=stats)[0]
        t["adaptive"] += time.perf_counter() - t0
        t["rows"] += stats["rows"]
        nodes.append(stats["nodes"][0].tolist())
        if ref is None:  # the adaptive rule's own estimates; captum is compared with its scores
            err.setdefault("adaptive estimate", []).append(stats["error_estimate"][0].tolist())
            ref = ada
        else:
            err.setdefault("adaptive", []).append([rel(ada[l], ref[l]) for l in range(L)])
            for rule, m in FIXED:
                s = ig_scores(model, it, cfg.replace(steps=m, rule=rule))[0]
                key = f"{'GL' if rule == 'gauss' else rule}-{m}"
                err.setdefault(key, []).append([rel(s[l], ref[l]) for l in range(L)])
        c50, ceq = [float("nan")] * L, [float("nan")] * L
        for l in cap_layers:
            t0 = time.perf_counter()
            c50[l] = rel(captum_neuron_ig(model, it, 50, l), ref[l])
            t["captum-50"] += time.perf_counter() - t0
            n_l = int(nodes[-1][l])
            t0 = time.perf_counter()
            ceq[l] = rel(captum_neuron_ig(model, it, n_l, l, rule=adaptive_rule(n_l, schedule)), ref[l])
            t["captum-eq"] += time.perf_counter() - t0
            t["eq_nodes"] += n_l
        t["eq_nodes_all"] += sum(nodes[-1])
        err.setdefault("captum-50", []).append(c50)
        err.setdefault("captum-eq", []).append(ceq)
        print(f"[{name}] prompt {i + 1}/{len(items)} done ({time.perf_counter() - T0:.0f}s)", file=sys.stderr)
        report(name, L, args, err, nodes, t, cap_layers, schedule)


def run_adaptive_only(name: str, args) -> None:
    """Per prompt and schedule: nodes, error estimate, completeness per layer, and the time."""
    import capinterp as ci
    import capinterp.kernels.adaptive as adaptive
    from capinterp.core.tokens import encode
    from capinterp.kernels.ig import ig_scores
    from capinterp.kernels.ig_config import IGConfig

    model = load(name)
    L = model.cfg.n_layers
    data = ci.data.arithmetic(ops="+", n=args.n, fmt="DG", lang="en", seed=5)
    items = encode(model, list(data)[: args.n], max_target_tokens=1)
    cfg = IGConfig(positions="last_prompt", batch_size=args.batch_size, invariance="off")
    schedules = [x.strip() for x in args.schedules.split(",")]
    ig_scores(model, items[0], cfg.replace(steps=1))  # the route's once-per-model check, outside the timings
    for i, it in enumerate(items):
        out, stats, secs = {}, {}, {}
        for sch in schedules:
            adaptive.SCHEDULE = sch
            stats[sch] = {}
            t0 = time.perf_counter()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                out[sch] = ig_scores(
                    model, it, cfg.replace(rule="adaptive", tol=args.tol, max_steps=args.max_steps), stats=stats[sch]
                )[0]
            secs[sch] = time.perf_counter() - t0
            for w in caught:
                print(f"[{name}] {sch}: {w.message}", file=sys.stderr)
            print(f"[{name}] prompt {i + 1}, {sch}: {secs[sch]:.0f}s", file=sys.stderr)
        print(f"\n## {name}, prompt {i + 1} ({data[i].prompt!r}), tol {args.tol:g}, max_steps {args.max_steps}")
        head = " | ".join(f"{s} nodes | {s} estimate | {s} completeness" for s in schedules)
        diff = len(schedules) > 1
        print(f"| layer | {head} |" + (f" {schedules[0]} vs {schedules[1]} |" if diff else ""))
        print("|---" * (1 + 3 * len(schedules) + diff) + "|")
        for l in range(L):
            cells = []
            for s in schedules:
                st = stats[s]
                cells += [f"{int(st['nodes'][0, l])}", f"{float(st['error_estimate'][0, l]):.2g}"]
                cells.append(f"{float(st['completeness'][0, l]):.2g}")
            if diff:
                cells.append(f"{rel(out[schedules[0]][l], out[schedules[1]][l]):.2g}")
            print(f"| {l} | " + " | ".join(cells) + " |")
        for s in schedules:
            st = stats[s]
            over = [l for l in range(L) if float(st["error_estimate"][0, l]) > args.tol]
            print(
                f"{s}: {secs[s]:.1f}s, {int(st['rows'])} rows, nodes total {int(st['nodes'][0].sum())}, "
                f"max estimate {float(st['error_estimate'][0].max()):.2g}, layers above tol {over}"
            )
        sys.stdout.flush()


def load(name: str):
    import capinterp as ci

    if name.startswith("tiny_hf:"):
        from capinterp.arch.tiny import tiny_hf

        hf, tok = tiny_hf(name.split(":", 1)[1])
        return ci.load_model(hf, tokenizer=tok)
    return ci.load_model(name)


def run_shape(name: str, args) -> None:
    """F(alpha a) and a . dF/da(alpha a) along the path, per layer, on the first prompt."""
    import capinterp as ci
    from capinterp.arch.model import neuron_hook
    from capinterp.core.tokens import encode

    model = load(name)
    enc = encode(model, list(ci.data.arithmetic(ops="+", n=1, fmt="DG", lang="en", seed=5))[:1], max_target_tokens=1)[0]
    pos, tgt = len(enc.prompt_ids) - 1, enc.target_ids[0]
    tokens = torch.tensor([enc.ids], device=model.cfg.device)

    def F(layer, value=None):
        def put(act, hook):
            act = act.clone()
            act[0, pos] = value.to(act.dtype)
            return act

        hooks = [] if value is None else [(neuron_hook(layer), put)]
        return torch.softmax(model.run_with_hooks(tokens, fwd_hooks=hooks)[0, pos].float(), -1)[tgt]

    print(f"\n## {name}: integrand along the path, first prompt, target token {tgt}")
    for layer in [int(x) for x in args.shape.split(",")]:
        _, cache = model.run_with_cache(tokens)
        a = cache[neuron_hook(layer)][0, pos].detach().float()
        w_out = model.blocks[layer].mlp.W_out.detach().float()
        ms = float((a @ w_out).pow(2).mean())
        eps = float(getattr(model.cfg, "eps", float("nan")))
        print(f"layer {layer}: eps {eps:g}, ms(W_out a) {ms:.3g}, alpha_c {(eps / ms) ** 0.5:.2g}")
        print("| alpha | F(alpha a) | a . dF/da(alpha a) |\n|---|---|---|")
        for al in [1, 0.6, 0.3, 0.2, 0.1, 0.03, 0.01, 3e-3, 1e-3, 1e-4, 0.0]:
            z = (al * a).requires_grad_(True)
            f = F(layer, z)
            (g,) = torch.autograd.grad(f, z)
            print(f"| {al:g} | {float(f):.6g} | {float((a * g).sum()):.4g} |")
    sys.stdout.flush()


def report(name, L, args, err, nodes, t, cap_layers, schedule) -> None:
    """The per-layer table and the time ratios over the prompts done so far."""
    n = len(nodes)
    k = len(cap_layers)
    nd = torch.tensor(nodes)
    cols = list(err)
    against = "the adaptive rule's scores" if args.no_reference else f"GL-{args.ref_steps}"
    print(f"\n## {name}: {L} layers, {n} prompts, tol {args.tol:g}, adaptive schedule {schedule}, reference {against}")
    print(
        "relative L2 error of the layer's scores against the reference, max over prompts"
        + ("; 'adaptive estimate': its own final error estimate" if args.no_reference else "")
        + f"; captum on layers {cap_layers} only; adaptive nodes mean / max\n"
    )
    print("| layer | " + " | ".join(cols) + " | adaptive nodes |")
    print("|---" * (len(cols) + 2) + "|")
    for l in range(L):
        vals = []
        for c in cols:
            v = torch.tensor([e[l] for e in err[c]])
            vals.append("" if torch.isnan(v).all() else f"{float(v[~torch.isnan(v)].max()):.2g}")
        print(f"| {l} | " + " | ".join(vals) + f" | {float(nd[:, l].mean()):.0f} / {int(nd[:, l].max())} |")
    worst = {c: max(x for e in err[c] for x in e if x == x) for c in cols}
    print("\nworst layer error over all prompts: " + ", ".join(f"{c} {v:.2g}" for c, v in worst.items()))
    # captum's cost is linear in its points (one full sequence each): measured on k layers, so GL-50 on
    # every layer is the measured time x L / k; at equal accuracy (the adaptive rule's own rule and nodes
    # per layer), the measured time per point x all layers' nodes
    per50 = t["captum-50"] / (50 * k * n)
    pereq = t["captum-eq"] / max(t["eq_nodes"], 1)
    c50 = per50 * 50 * L
    ceq = pereq * t["eq_nodes_all"] / n
    ada = t["adaptive"] / n
    print(
        f"measured per prompt: adaptive {ada:.2f}s on all {L} layers ({t['rows'] / n:.0f} rows, "
        f"{t['eq_nodes_all'] / n:.0f} nodes over the layers); captum on layers {cap_layers}: GL-50 "
        f"{t['captum-50'] / n:.1f}s ({per50:.3f}s a point), adaptive's rule "
        f"{t['captum-eq'] / n:.1f}s ({t['eq_nodes'] / n:.0f} points, {pereq:.3f}s a point)"
    )
    print(
        f"scaled to all {L} layers: captum-50 {c50:.1f}s (x{L / k:.1f} layers); captum-eq {ceq:.1f}s "
        f"(its time a point x all layers' adaptive nodes)"
    )
    print(
        f"ratio captum / adaptive: default GL-50 {c50 / ada:.1f}x, at equal accuracy (adaptive's rule and nodes) "
        f"{ceq / ada:.1f}x ({torch.get_num_threads()} thread(s), {n} prompt(s))"
    )
    if schedule == "doubling":
        # captum's public attribute takes one n_steps for all layers: the same accuracy on every layer
        # needs the worst layer's Gauss-Legendre nodes everywhere (its GL-50 time a point)
        uni = int(nd.max())
        cuni = per50 * L * uni
        print(
            f"captum with one node count for all layers (the most any layer needed, GL-{uni}): {cuni:.1f}s, "
            f"ratio {cuni / ada:.1f}x"
        )
    else:
        print(
            f"(schedule {schedule}: captum's public attribute has no graded rule; captum-eq runs the adaptive "
            "rule's alphas and weights through IntegratedGradients._attribute)"
        )
    sys.stdout.flush()


T0 = time.perf_counter()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="smollm2,gemma3")
    ap.add_argument("--n", type=int, default=10)
    ap.add_argument("--tol", type=float, default=1e-3)
    ap.add_argument("--max-steps", type=int, default=128)
    ap.add_argument("--ref-steps", type=int, default=200)
    ap.add_argument(
        "--captum-layers", default="", help="comma-separated layers timed for captum (default: first, middle, last)"
    )
    ap.add_argument(
        "--no-reference",
        action="store_true",
        help="skip the GL-200 reference and the fixed rules: the adaptive rule's estimates stand in, captum is "
        "compared with the adaptive scores",
    )
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--adaptive-only", action="store_true", help="only the adaptive rule, per schedule")
    ap.add_argument("--shape", default="", help="comma-separated layers: print the integrand along the path instead")
    ap.add_argument("--schedules", default="graded,doubling", help="with --adaptive-only: adaptive schedules to run")
    args = ap.parse_args()
    from capinterp.core.settings import set_threads

    set_threads(args.threads)
    for name in args.models.split(","):
        run = run_shape if args.shape else run_adaptive_only if args.adaptive_only else run_model
        run(name.strip(), args)


if __name__ == "__main__":
    main()
