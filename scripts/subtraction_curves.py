"""Sufficiency and necessity on subtraction: both faithfulness curves, the random band, and what
the layer norms do to them.

    python scripts/subtraction_curves.py --model gemma3 --threads 1

On the ``sub`` capability (the faithfulness experiment's task: ranked on the locate split, measured
on held-out problems), per share x of the FFN neurons, prints p(answer) with

* **kept**: only the top-x neurons of a ranking run, every other one mean-ablated (sufficiency; its
  area over x, normalized by the full model and everything ablated, is MIB's CPR);
* **ablated**: only the top-x are mean-ablated (necessity: the share of the behaviour lost),

for CNL's signed IG ranking, the same scores by magnitude, and ``--draws`` random neuron sets of each
size (their mean and range). Mean ablation keeps the first position apart, as the library does.

It runs every configuration twice: as the library does, and with **the final RMSNorm's scale
frozen** at the clean run's value for the same example and position (out * rms(x) / rms(x_clean),
so the norm divides by what it divided by in the clean run; ``--freeze all`` freezes every norm,
which on a gated-MLP model lets an ablation's change of scale compound from layer to layer until it
overflows: p is then NaN). Where keeping a few neurons and mean-ablating the rest changes the
residual stream's size, the final norm rescales what is left before the unembedding; freezing it
shows how much of a curve is that rescaling. The script first checks that its own loop reproduces
:func:`capinterp.faithfulness` on the same sets (to 1e-4 of p) before it reports anything.
"""

from __future__ import annotations

import argparse
import sys
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's capinterp, whatever is installed

import numpy as np
import torch

FRACTIONS = (0.01, 0.1, 0.25, 0.5, 0.75, 0.9)


def rms_norms(model, which: str) -> list[torch.nn.Module]:
    """The transformers RMSNorm modules (refused: any other norm): the final one before the
    unembedding (``which="final"``), or every one (``"all"``)."""
    root = getattr(model, "original_model", model)  # the transformers model a bridge wraps
    named = [(n, m) for n, m in root.named_modules() if type(m).__name__.endswith("RMSNorm")]
    mods = [m for n, m in named if not hasattr(m, "hook_in") and (which == "all" or ".layers." not in n)]
    if which == "final" and len(mods) != 1:
        raise SystemExit(f"expected one final norm outside the layers, found {len(mods)}")
    other = {type(m).__name__ for m in model.modules() if "LayerNorm" in type(m).__name__ and not hasattr(m, "hook_in")}
    if not mods or other:
        raise SystemExit(f"this script freezes RMSNorm scales only; the model has {sorted(other) or 'none'}")
    return mods


def _ms(x: torch.Tensor) -> torch.Tensor:
    return x.float().pow(2).mean(-1, keepdim=True)


@contextmanager
def frozen_norms(norms: list[torch.nn.Module], clean: dict[int, torch.Tensor] | None):
    """With ``clean`` (each norm's clean mean square of its input, ``[1, T, ..., 1]``): every norm's
    output scaled by sqrt((ms(x) + eps) / (ms_clean + eps)); with None: record ``clean`` instead."""
    record: dict[int, torch.Tensor] = {}

    def hook(i: int):
        def fn(mod, args, out):
            eps = float(getattr(mod, "eps", getattr(mod, "variance_epsilon", 1e-6)))
            ms = _ms(args[0])
            if clean is None:
                if i in record:
                    raise SystemExit("a norm module runs twice in one forward pass: its clean scale is ambiguous")
                record[i] = ms
                return None
            return (out.float() * ((ms + eps) / (clean[i] + eps)).sqrt()).to(out.dtype)

        return fn

    handles = [m.register_forward_hook(hook(i)) for i, m in enumerate(norms)]
    try:
        yield record
    finally:
        for h in handles:
            h.remove()


@torch.no_grad()
def p_answer(model, item, keep: torch.Tensor, means: torch.Tensor, norms, freeze: bool, bs: int) -> np.ndarray:
    """``[n_configs]`` p(first answer token) of one problem, neurons outside ``keep`` (bool
    ``[n_configs, L, d]``) mean-ablated at every position, norms frozen or not."""
    from capinterp.arch.forward import logits_at
    from capinterp.arch.model import neuron_hook
    from capinterp.core.position_mean import at_positions

    T = len(item.ids)
    ids = torch.tensor([item.ids], device=model.cfg.device)
    last = torch.tensor([item.last_prompt_pos])
    clean = None
    if freeze:
        with frozen_norms(norms, None) as clean:
            logits_at(model, ids, last)
    ref = torch.stack([at_positions(means[l], T) for l in range(means.shape[0])])  # [L, T, d]
    out = []
    for s in range(0, keep.shape[0], bs):
        k = keep[s : s + bs].to(model.cfg.device)

        def ablate(l: int, k=k):
            return lambda act, hook: torch.where(k[:, l][:, None, :], act, ref[l].to(act.dtype))

        hooks = [(neuron_hook(l), ablate(l)) for l in range(ref.shape[0])]
        with frozen_norms(norms, clean) if freeze else nullcontext():
            logits = logits_at(model, ids.expand(k.shape[0], T), last.expand(k.shape[0]), fwd_hooks=hooks)
        out.append(logits.softmax(-1)[:, item.target_ids[0]].double().cpu())
    return torch.cat(out).numpy()


def masks(order: torch.Tensor, sizes: list[int], shape: tuple[int, int]) -> torch.Tensor:
    """``[2 * len(sizes), L, d]``: per size, the top-k kept (others ablated), then the top-k ablated."""
    rows = []
    for k in sizes:
        top = torch.zeros(order.numel(), dtype=torch.bool)
        top[order[:k]] = True
        rows += [top.view(shape), ~top.view(shape)]
    return torch.stack(rows)


def area(x: list[float], y: np.ndarray) -> float:
    """Trapezoid area over [0, 1] of a curve with its end points added (0 at 0, 1 at 1)."""
    xs, ys = np.r_[0.0, x, 1.0], np.r_[0.0, y, 1.0]
    return float(((ys[1:] + ys[:-1]) / 2 * np.diff(xs)).sum())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gemma3")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--problems", type=int, default=16, help="held-out problems measured")
    ap.add_argument("--draws", type=int, default=4, help="random neuron sets per size")
    ap.add_argument("--freeze", choices=("final", "all"), default="final", help="which norms to freeze")
    ap.add_argument("--steps", type=int, default=3, help="CNL's IG points (right Riemann sum)")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="cache folder for the CNL fit")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    from capinterp.arch.model import load_model, neuron_shape
    from capinterp.core.tokens import encode
    from capinterp.experiments import capability_data as cd
    from capinterp.experiments.base import Context
    from capinterp.interventions.faithfulness import ablated_metric, neuron_means

    # the full variant's data (32 held-out problems), CNL with --steps right-rule IG points
    ctx = Context(load_model(args.model, threads=args.threads), quick=False, workdir=args.out, seed=args.seed)
    model = ctx.model
    sub = cd.prepared(ctx, {**cd.settings(ctx), "capabilities": ("sub",)})["sub"]
    measure = sub.test[: args.problems]
    if len(measure) < args.problems:
        print(f"# only {len(measure)} held-out problems the model solves", file=sys.stderr)
    scores = ctx.localize("cnl", "faith_sub", sub.locate, steps=args.steps, rule="right").scores.float()
    L, d = neuron_shape(model)
    n = L * d
    sizes = [max(1, round(f * n)) for f in FRACTIONS]
    g = torch.Generator().manual_seed(args.seed)
    orders = {
        "cnl": scores.flatten().argsort(descending=True),
        "|cnl|": scores.flatten().abs().argsort(descending=True),
    }
    orders |= {f"random {r}": torch.randperm(n, generator=g) for r in range(args.draws)}
    base = torch.stack([torch.ones(L, d, dtype=torch.bool), torch.zeros(L, d, dtype=torch.bool)])
    keep = torch.cat([base] + [masks(o, sizes, (L, d)) for o in orders.values()])
    items = encode(model, measure)
    means = neuron_means(model, items).transpose(0, 1)  # [L, 2, d]: first position, later ones
    norms = rms_norms(model, args.freeze)
    lib = ablated_metric(model, items, keep[:6], batch_size=args.batch_size)
    for freeze in (False, True):
        p = np.mean([p_answer(model, it, keep, means, norms, freeze, args.batch_size) for it in items], 0)
        if not freeze and np.abs(lib - p[:6]).max() > 1e-4:  # checked before anything is reported
            raise SystemExit(f"this loop disagrees with capinterp.faithfulness: {lib} vs {p[:6]}")
        mode = f"{'the final norm' if args.freeze == 'final' else 'every norm'} frozen at the clean scale"
        report(p, list(orders), sizes, n, mode if freeze else "as the library ablates")
    print(f"# {len(items)} problems, {args.draws} random draws, {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return 0


def report(p: np.ndarray, names: list[str], sizes: list[int], n: int, mode: str) -> None:
    """Print one mode's curves (kept and ablated p per size) and areas per ranking, random ones pooled."""
    full, empty = p[0], p[1]
    curves = p[2:].reshape(len(names), len(sizes), 2)  # [ranking, size, kept / ablated]
    xs = [k / n for k in sizes]
    f = (curves[..., 0] - empty) / (full - empty)  # sufficiency
    lost = (full - curves[..., 1]) / (full - empty)  # necessity: share of the behaviour lost
    print(f"\n## {mode}: p(answer) full {full:.4f}, everything ablated {empty:.4f}")
    print("| ranking | curve | " + " | ".join(f"{x:.0%}" for x in xs) + " | area |")
    print("|---|---|" + "---|" * (len(xs) + 1))
    rand = [i for i, nm in enumerate(names) if nm.startswith("random")]
    for label, rows in [(nm, [i]) for i, nm in enumerate(names) if not nm.startswith("random")] + [("random", rand)]:
        for curve, vals, y in (("kept p", curves[rows, :, 0], f[rows]), ("ablated p", curves[rows, :, 1], lost[rows])):
            cells = [_cell(vals[:, j]) for j in range(len(xs))]
            areas = np.array([area(xs, yy) for yy in y])
            print(f"| {label} | {curve} | " + " | ".join(cells) + f" | {_cell(areas)} |")


def _cell(v: np.ndarray) -> str:
    return f"{v.mean():.3f}" if len(v) == 1 else f"{v.mean():.3f} ({v.min():.3f}-{v.max():.3f})"


if __name__ == "__main__":
    raise SystemExit(main())
