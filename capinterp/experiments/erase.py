"""Erasing capability neurons: a sigma sweep against random sets (Huang et al. 2025, Table 3) and IPP (Table 4).

Per capability, CNL neurons are located on the train-split localization examples (the pooled
half fits of :mod:`capinterp.experiments.commonality`), selected at each ``sigma``, and zeroed at
every position (:func:`capinterp.interventions.hooks.erase`); the metric is measured on held-out
test-split examples before, after erasing them, and after erasing each of ``n_random`` seeded
random neuron sets of the same size. IPP (:func:`capinterp.units.metrics.ipp`) uses the *drops*:
IPP = drop(located) - max_r drop(random_r), positive when the located set hurts more than every
random draw (docs/results.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from capinterp.core import validate
from capinterp.core.example import Example, as_examples
from capinterp.core.protocol import Model
from capinterp.experiments import capability_data as cd
from capinterp.experiments.base import Context, ExperimentResult, experiment
from capinterp.experiments.scoring import measure
from capinterp.interventions.hooks import erase
from capinterp.units import metrics
from capinterp.units.neurons import NeuronScores, NeuronSet

__all__ = ["COLUMNS", "PAPER_TABLE3", "PAPER_TABLE4", "erase_figure", "erase_table", "random_sets", "run"]

NAME, TITLE = "erase", "Erasing capability neurons vs random neurons (Huang et al. 2025, Tables 3-4)"

#: Huang et al. 2025, Table 3, accuracy in %: columns GSM8K, Emotion, Code25K, average. The sigma label of
#: each (Random, Locate) pair is lost in the text extraction; they are listed in the paper's order.
PAPER_TABLE3: dict[str, Any] = {
    "columns": ["GSM8K", "Emotion", "Code25K", "avg"],
    "Llama2-7B": {
        "base": [0.00, 17.63, 40.80, 19.48],
        "random": [[0.00, 17.38, 40.59, 19.32], [0.00, 17.50, 40.67, 19.39], [0.00, 17.54, 40.79, 19.44]],
        "located": [[0.00, 0.00, 25.86, 8.62], [0.00, 3.38, 32.77, 12.05], [0.06, 10.38, 34.11, 14.85]],
    },
    "Llama2-13B": {
        "base": [0.38, 31.96, 45.95, 26.10],
        "random": [[1.00, 30.96, 45.72, 25.89], [0.31, 33.75, 45.81, 26.62], [0.38, 32.04, 45.80, 26.07]],
        "located": [[0.00, 0.33, 21.95, 7.42], [0.00, 5.38, 18.06, 7.81], [0.31, 2.50, 20.48, 7.76]],
    },
}
#: Huang et al. 2025, Table 4: overlap %, located parameters %, IPP (percentage points).
PAPER_TABLE4: dict[str, dict[str, float]] = {
    "KN": {"overlap": 37.3, "neuron_pct": 0.2, "ipp": 11.4},
    "ROME": {"overlap": 32.7, "neuron_pct": 16.7, "ipp": 0.0},
    "KC": {"overlap": 7.2, "neuron_pct": 1.6, "ipp": 10.5},
    "CNL": {"overlap": 96.4, "neuron_pct": 0.2, "ipp": 20.0},
}
COLUMNS = [
    "capability",
    "metric",
    "sigma",
    "n_neurons",
    "ratio_pct",
    "n_test",
    "n_random",
    "base",
    "located",
    "random_mean",
    "random_min",
    "random_max",
    "drop",
    "drop_random_mean",
    "ipp",
    "base_prob",
    "located_prob",
    "random_prob_mean",
]


def random_sets(neurons: NeuronSet, n_random: int, seed: int = 0) -> list[NeuronSet]:
    """``n_random`` random sets of ``neurons``' size, drawn with seeds ``seed*1000 + r`` (reproducible)."""
    return [neurons.random_like(seed=seed * 1000 + r) for r in range(n_random)]


def _erased(
    model: Model, neurons: NeuronSet, examples: list[Example], metric: str, batch_size: int
) -> dict[str, float]:
    with erase(model, neurons):
        return measure(model, examples, metric, batch_size)


def erase_table(
    model: Model,
    scores: Mapping[str, NeuronScores],
    tests: Mapping[str, Sequence[Example]],
    *,
    metrics_by_name: Mapping[str, str] | None = None,
    sigmas: Sequence[float] = (3.0, 4.0, 5.0, 6.0),
    n_random: int = 5,
    seed: int = 0,
    batch_size: int = 16,
    device: Any = None,
) -> pd.DataFrame:
    """One row per (capability, sigma): the metric before, after erasing the located set, and
    after erasing each random equal-size set (mean, min, max), the drops and IPP.

    Args:
        scores: capability -> localization scores (selected at each sigma).
        tests: capability -> held-out evaluation examples.
        metrics_by_name: capability -> ``"accuracy"`` / ``"target_prob"``
            (default :data:`~capinterp.experiments.capability_data.DEFAULT_METRIC`).
        n_random: random draws R per set (>= 1).
    """
    n_random = validate.positive_int("n_random (IPP needs a random control)", n_random)
    cd.on_device(model, device)
    rows = []
    for name, sc in scores.items():
        exs, metric = as_examples(tests[name]), (metrics_by_name or {}).get(name, cd.metric_for(name))
        base = measure(model, exs, metric, batch_size)
        for sigma in sigmas:
            located = sc.select(sigma=float(sigma))
            loc = _erased(model, located, exs, metric, batch_size)
            rnd = [_erased(model, r, exs, metric, batch_size) for r in random_sets(located, n_random, seed)]
            rv = np.array([r["value"] for r in rnd])
            rows.append(
                {
                    "capability": name,
                    "metric": metric,
                    "sigma": float(sigma),
                    "n_neurons": len(located),
                    "ratio_pct": 100 * located.ratio,
                    "n_test": len(exs),
                    "n_random": n_random,
                    "base": base["value"],
                    "located": loc["value"],
                    "random_mean": float(rv.mean()),
                    "random_min": float(rv.min()),
                    "random_max": float(rv.max()),
                    "drop": base["value"] - loc["value"],
                    "drop_random_mean": float(base["value"] - rv.mean()),
                    "ipp": metrics.ipp(base["value"] - loc["value"], base["value"] - rv, higher_is_better=True),
                    "base_prob": base["prob"],
                    "located_prob": loc["prob"],
                    "random_prob_mean": float(np.mean([r["prob"] for r in rnd])),
                }
            )
    return pd.DataFrame(rows, columns=COLUMNS)


def erase_figure(table: pd.DataFrame) -> go.Figure:
    """Relative drop (% of base) against sigma: located (solid) vs random mean (dotted) per capability."""
    fig = go.Figure()
    for name, sub in table.groupby("capability", sort=False):
        base = sub["base"].replace(0, np.nan)
        fig.add_scatter(
            x=sub["sigma"],
            y=100 * sub["drop"] / base,
            mode="lines+markers",
            name=f"{name} located",
            legendgroup=name,
            customdata=sub[["n_neurons", "metric", "base", "located"]],
            hovertemplate=f"{name}" + " sigma %{x}: %{customdata[0]} neurons, %{customdata[1]} "
            "%{customdata[2]:.3f} -> %{customdata[3]:.3f}<extra></extra>",
        )
        fig.add_scatter(
            x=sub["sigma"],
            y=100 * sub["drop_random_mean"] / base,
            mode="lines+markers",
            line_dash="dot",
            name=f"{name} random",
            legendgroup=name,
        )
    fig.update_layout(
        title="Erasing located vs random neurons (held-out examples)",
        xaxis_title="sigma (mask threshold)",
        yaxis_title="drop, % of base",
    )
    return fig


@experiment(NAME, TITLE)
def run(ctx: Context) -> ExperimentResult:
    """Table 3 (sigma sweep) and the CNL row of Table 4 (IPP) on the capability datasets."""
    s = cd.settings(ctx)
    data = cd.prepared(ctx, s)
    scores = {k: cd.located_scores(ctx.localize, "cnl", d, ctx.seed, **s["params"]["cnl"]) for k, d in data.items()}
    sigmas = (3.0, 6.0) if ctx.quick else (3.0, 4.0, 5.0, 6.0)
    n_random = ctx.size(1, 3)  # quick: one random control per sigma (a smoke test of the comparison)
    table = erase_table(
        ctx.model,
        scores,
        {k: d.test for k, d in data.items()},
        metrics_by_name={k: d.metric for k, d in data.items()},
        sigmas=sigmas,
        n_random=n_random,
        seed=ctx.seed,
        batch_size=ctx.batch_size,
    )
    table.insert(6, "n_solved", table["capability"].map({k: d.n_solved for k, d in data.items()}))
    at6 = table[table["sigma"] == 6.0]
    info = {
        "paper": {"table3_pct": PAPER_TABLE3, "table4": PAPER_TABLE4},
        "cnl_ipp_pct_mean_sigma6": float(100 * at6["ipp"].mean()),
        "cnl_ratio_pct_mean_sigma6": float(at6["ratio_pct"].mean()),
        "settings": {**s, "capabilities": list(s["capabilities"]), "sigmas": list(sigmas), "n_random": n_random},
        "notes": [
            "metric per row: 'accuracy' (greedy, parsed) or 'target_prob' (mean teacher-forced probability "
            "of the target's content tokens); base/located/random_* are fractions in that metric.",
            "random_min is the strongest random control (largest drop); ipp = drop - max random drop "
            "(a fraction; cnl_ipp_pct_mean_sigma6 is in percentage points, like the paper's Table 4 IPP).",
            "Located on train-split examples (pooled halves of the commonality fits), measured on test-split examples.",
        ],
    }
    neurons = {f"cnl_{k}_sigma6": sc.select(sigma=6.0) for k, sc in scores.items()}
    return ExperimentResult(NAME, TITLE, table, erase_figure(table), info, neurons)
