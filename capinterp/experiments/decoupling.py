"""Decoupling: the same expression, two task requirements (Huang et al. 2025, Sec. 4, Eqs. 4-6).

Each comparative pair shares one arithmetic "main part" (``3+4=?``) and differs in the task:

* sub-1 (compute): ``"Provide the correct answer for 3+4=?\\n3+4="`` -> the answer (``"7"``; KN
  scores its first token);
* sub-2 (code): ``"Write Python code for 3+4=?\\n```python\\n"`` -> the model's greedy next token
  (e.g. ``"print"``), filled in by :func:`~capinterp.experiments._per_sample.with_greedy_targets`.

Every sample gets its own KN set (per-prompt coarse set, :mod:`capinterp.experiments._per_sample`).
The table compares the sets by IoU (and the overlap coefficient): within each pair, over all
sub-1 samples (mean pairwise), over all sub-2 samples, and across tasks between different pairs
(a control: what sharing only the task format, not the expression, gives).
Paper (GPT-J, 1000 pairs, Eq. 6, denominator not stated): 15.6 % within a pair, 7.3 % over all
sub-1, 8.6 % over all sub-2.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from capinterp.core.example import Example
from capinterp.core.protocol import Model
from capinterp.data.arithmetic import arithmetic
from capinterp.experiments._per_sample import ScoreCache, kn_neurons, kn_scores, with_greedy_targets
from capinterp.experiments.base import Context, ExperimentResult, experiment
from capinterp.plots.paper import measured_vs_paper
from capinterp.units import metrics
from capinterp.units.neurons import NeuronSet

__all__ = ["PAPER", "decoupling_pairs", "decoupling_table", "locate_pairs", "run"]

PAPER = {"within pair": 15.6, "all sub-1": 7.3, "all sub-2": 8.6}  # % (Huang et al. 2025, Sec. 4, GPT-J)
COMPARISONS = ("within pair", "all sub-1", "all sub-2", "across tasks, other pairs")


def decoupling_pairs(n: int, seed: int = 0, ops: str = "+-*") -> list[tuple[Example, Example]]:
    """``n`` seeded pairs (compute, code) over distinct single-digit expressions.

    The compute prompt's target is the answer (no leading space, it follows ``=``); the code
    prompt's target is empty (the model's greedy next token is used).
    """
    exprs = arithmetic(ops=ops, n=n, seed=seed, style="zeroshot", unique=True)
    pairs = []
    for i, e in enumerate(exprs):
        x = e.meta["expression"]
        meta = {"pair": i, "expression": x, "answer": e.meta["answer"], "source": "decoupling"}
        pairs.append(
            (
                Example(
                    f"Provide the correct answer for {x}=?\n{x}=", str(e.meta["answer"]), {**meta, "task": "compute"}
                ),
                Example(
                    f"Write Python code for {x}=?\n```python\n", "", {**meta, "task": "code", "target_from": "greedy"}
                ),
            )
        )
    return pairs


def locate_pairs(
    model: Model,
    pairs: Sequence[tuple[Example, Example]],
    *,
    steps: int = 20,
    threshold: float = 0.2,
    rule: str = "right",
    cache: ScoreCache | None = None,
) -> tuple[list[NeuronSet], list[NeuronSet], list[Example]]:
    """Per-sample KN sets of every sub-1 and sub-2 prompt, and the examples with their targets filled."""
    flat = with_greedy_targets(model, [ex for pair in pairs for ex in pair])
    sets = [kn_neurons(kn_scores(model, ex, steps=steps, rule=rule, cache=cache), threshold) for ex in flat]
    return sets[0::2], sets[1::2], flat


def _mean(pairs: list[tuple[NeuronSet, NeuronSet]], fn: Any) -> float:
    return float(np.mean([fn(a, b) for a, b in pairs])) if pairs else float("nan")


def decoupling_table(sub1: Sequence[NeuronSet], sub2: Sequence[NeuronSet]) -> pd.DataFrame:
    """IoU and overlap (in %) within pairs, within each group (mean pairwise), and across tasks."""
    if len(sub1) != len(sub2):
        raise ValueError(f"{len(sub1)} sub-1 sets but {len(sub2)} sub-2 sets")
    groups = {
        "within pair": list(zip(sub1, sub2)),
        "all sub-1": list(itertools.combinations(sub1, 2)),
        "all sub-2": list(itertools.combinations(sub2, 2)),
        "across tasks, other pairs": [(a, b) for i, a in enumerate(sub1) for j, b in enumerate(sub2) if i != j],
    }
    rows = [
        {
            "comparison": name,
            "n_comparisons": len(p),
            "iou": round(100 * _mean(p, metrics.iou), 2),
            "iou_chance": round(100 * _mean(p, lambda a, b: metrics.chance(a, b, "iou").expected), 2),
            "overlap": round(100 * _mean(p, metrics.overlap), 2),
            "overlap_chance": round(100 * _mean(p, lambda a, b: metrics.chance(a, b, "overlap").expected), 2),
            "paper": PAPER.get(name, np.nan),
        }
        for name, p in groups.items()
    ]
    return pd.DataFrame(rows)


def _figure(table: pd.DataFrame) -> go.Figure:
    return measured_vs_paper(
        table["comparison"],
        table["iou"],
        table["paper"],
        measured_name="measured IoU",
        title="Decoupling: KN sets of 'compute X' vs 'write code for X'",
        yaxis_title="mean pairwise IoU (%)",
    )


@experiment("decoupling", "Decoupling: compute vs code prompts on the same expression (Huang et al. 2025, Sec. 4)")
def run(ctx: Context) -> ExperimentResult:
    """Seeded single-digit pairs; per-sample KN sets; IoU within pairs vs within groups."""
    n, ig = ctx.size(4, 24), ctx.ig(3, 10)
    steps = ig["steps"]
    pairs = decoupling_pairs(n, seed=ctx.seed)
    sub1, sub2, flat = locate_pairs(ctx.model, pairs, **ig, cache=ctx.scores)
    table = decoupling_table(sub1, sub2)
    code_targets = pd.Series([e.target for e in flat[1::2]]).value_counts().head(5).to_dict()
    info = {
        "paper_percent": PAPER,
        "n_pairs": n,
        "kn_steps": steps,
        "kn_rule": ig["rule"],
        "mean_neurons_sub1": float(np.mean([len(s) for s in sub1])),
        "mean_neurons_sub2": float(np.mean([len(s) for s in sub2])),
        "code_targets": code_targets,
        "notes": (
            "Per-sample KN coarse sets (IG at the last prompt token, > 0.2 x max). Sub-1 target: the "
            "answer's first token; sub-2 target: the model's greedy next token. Group values are mean "
            "pairwise IoU (the paper's Eq. 6 denominator is not stated). The paper used GPT-J, 1000 pairs."
        ),
    }
    return ExperimentResult("decoupling", "Decoupling compute and code requirements", table, _figure(table), info)
