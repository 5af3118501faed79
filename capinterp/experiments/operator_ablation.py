"""Cross-operator ablation (the DCSN paper, anon. 2025, Table 5).

Erase one operator's DCSN neurons (the top ``fraction`` by |C - mean|, or all located with
``fraction=1``) and measure accuracy and mean target probability on every operator's 1-OP
test items: a 4 x 4 matrix of drops. The paper finds a large diagonal and weaker inverse-pair
effects (erasing "-" hurts "+", "/" hurts "*"). The random-control row erases, for each test
operator, a random set the size of *that* operator's erased set (``random_like(seed)``).
Neurons are located on one seed and tested on items drawn with another.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from capinterp.core.example import Example
from capinterp.core.protocol import Model
from capinterp.experiments.base import Context, ExperimentResult, experiment
from capinterp.experiments.dcsn_common import (
    OP_NAMES,
    OPS,
    context_scorer,
    one_op_data,
    operator_neurons,
    top_fraction,
)
from capinterp.experiments.scoring import greedy_correct, target_scores
from capinterp.interventions.hooks import erase
from capinterp.units.neurons import NeuronSet

__all__ = ["PAPER", "TITLE", "ablation_matrix", "drop_matrix", "per_op", "run"]

TITLE = "Capability-specific neurons (DCSN paper, anon. 2025): cross-operator ablation"
PAPER = {  # Table 5, LLaMA-3-8B: accuracy drop (points), rows = test items, columns = erased operator
    "1-OP (+)": {"+": 23.9, "-": 6.3, "*": 0.1, "/": 0.2},
    "1-OP (-)": {"+": 5.7, "-": 23.8, "*": 0.0, "/": 0.1},
    "1-OP (*)": {"+": 0.0, "-": 0.3, "*": 18.0, "/": 6.0},
    "1-OP (/)": {"+": 0.4, "-": 0.1, "*": 5.3, "/": 17.8},
}


def per_op(
    model: Model, tests: Mapping[str, list[Example]], ops: Sequence[str], batch_size: int = 16
) -> dict[str, tuple[float, float]]:
    """(accuracy, mean p(first target token)) of each operator's items.

    :func:`~capinterp.kernels.evaluate.evaluate`'s numbers from one teacher-forced pass over all items,
    decoding only the examples that pass cannot decide
    (:func:`~capinterp.experiments.scoring.greedy_correct`).
    """
    items = [e for op in ops for e in tests[op]]
    stats = target_scores(model, items, batch_size)
    correct = greedy_correct(model, items, stats, batch_size)
    out, start = {}, 0
    for op in ops:
        part = slice(start, start + len(tests[op]))
        start += len(tests[op])
        out[op] = (float(np.mean(correct[part])), float(np.mean(stats["first_prob"][part])))
    return out


def ablation_matrix(
    model: Model,
    tests: Mapping[str, list[Example]],
    erase_sets: Mapping[str, NeuronSet],
    *,
    seed: int = 0,
    random_control: bool = True,
    batch_size: int = 16,
    base: Mapping[str, tuple[float, float]] | None = None,
) -> pd.DataFrame:
    """Long table: one row per (erased, test_op), erased in ``erase_sets`` (+ "random").

    Columns: erased, test_op, n, n_erased, acc_base, acc, drop (points), prob_base, prob,
    prob_drop (points); accuracies and probabilities in percent. ``base`` (accuracy, mean
    probability per test operator, as fractions) skips the unmodified evaluation when given.
    """
    ops = list(tests)
    base = dict(base) if base is not None else per_op(model, tests, ops, batch_size)
    rows = []

    def add(erased: str, op: str, n_erased: int, after: tuple[float, float]) -> None:
        (a0, p0), (a1, p1) = base[op], after
        rows.append(
            {
                "erased": erased,
                "test_op": op,
                "n": len(tests[op]),
                "n_erased": n_erased,
                "acc_base": 100 * a0,
                "acc": 100 * a1,
                "drop": 100 * (a0 - a1),
                "prob_base": 100 * p0,
                "prob": 100 * p1,
                "prob_drop": 100 * (p0 - p1),
            }
        )

    for name, ns in erase_sets.items():
        with erase(model, ns):
            res = per_op(model, tests, ops, batch_size)
        for op in ops:
            add(name, op, len(ns), res[op])
    if random_control:
        for op in ops:
            control = erase_sets[op].random_like(seed)
            with erase(model, control):
                add("random", op, len(control), per_op(model, {op: tests[op]}, [op], batch_size)[op])
    return pd.DataFrame(rows)


def drop_matrix(table: pd.DataFrame, value: str = "drop") -> pd.DataFrame:
    """Square view: rows = erased set, columns = test operator."""
    m = table.pivot(index="erased", columns="test_op", values=value)
    rows = [r for r in table["erased"].drop_duplicates()]
    cols = [c for c in table["test_op"].drop_duplicates()]
    return m.loc[rows, cols]


def _figure(table: pd.DataFrame) -> Any:
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fracs = sorted(table["fraction"].unique())
    titles = [f"erase {'all located' if f >= 1 else f'top {f:.0%}'}: accuracy drop (points)" for f in fracs]
    fig = make_subplots(rows=1, cols=len(fracs), subplot_titles=titles)
    for j, f in enumerate(fracs, start=1):
        part = table[table["fraction"] == f]
        m, p = drop_matrix(part), drop_matrix(part, "prob_drop")
        hover = [
            [f"erase {r} on {c}: accuracy drop {m.loc[r, c]:.1f}, p(target) drop {p.loc[r, c]:.1f}" for c in m.columns]
            for r in m.index
        ]
        fig.add_trace(
            go.Heatmap(
                z=m.to_numpy(),
                x=[f"1-OP ({c})" for c in m.columns],
                y=list(m.index),
                text=m.round(1).to_numpy(),
                texttemplate="%{text}",
                customdata=hover,
                hovertemplate="%{customdata}<extra></extra>",
                colorscale="RdBu_r",
                zmid=0,
                showscale=j == len(fracs),
            ),
            row=1,
            col=j,
        )
        fig.update_yaxes(autorange="reversed", title_text="erased neurons" if j == 1 else None, row=1, col=j)
    fig.update_layout(title=TITLE)
    return fig


@experiment("operator_ablation", TITLE)
def run(ctx: Context) -> ExperimentResult:
    """The registered experiment: cross-operator ablation on the context's model."""
    sigma, fractions = 6.0, ((1.0,) if ctx.quick else (0.1, 1.0))
    n_loc, n_test = ctx.size(6, 50), ctx.size(2, 16)
    scores, sets = operator_neurons(context_scorer(ctx), n_loc, ctx.seed, sigma)
    tests = {op: one_op_data(op, n_test, ctx.seed + 1) for op in OPS}
    base = per_op(ctx.model, tests, OPS, ctx.batch_size)
    parts = []
    for f in fractions:
        erase_sets = {op: top_fraction(scores[op], sets[op], f) for op in OPS}
        t = ablation_matrix(ctx.model, tests, erase_sets, seed=ctx.seed, batch_size=ctx.batch_size, base=base)
        parts.append(t.assign(fraction=f))
    table = pd.concat(parts, ignore_index=True)
    info = {
        "paper": PAPER,
        "measured_drop": {
            str(f): drop_matrix(table[table.fraction == f]).round(1).to_dict(orient="index") for f in fractions
        },
        "set_sizes": {op: len(s) for op, s in sets.items()},
        "located_per_layer": {op: s.per_layer().tolist() for op, s in sets.items()},
        "sigma": sigma,
        "fractions": list(fractions),
        "n_localize_per_op": n_loc,
        "n_test_per_op": n_test,
        "notes": (
            "Rows erased set, columns test operator (the paper's Table 5 is the transpose). DCSN on "
            f"1-OP DG (en, compact) examples with a right first token, seed {ctx.seed}; test items seed "
            f"{ctx.seed + 1}. drop = accuracy before - after, in points; prob_drop likewise for p(target)."
        ),
    }
    neurons = {f"{OP_NAMES[op]}_all": s for op, s in sets.items()}
    return ExperimentResult("operator_ablation", TITLE, table, _figure(table), info, neurons)
