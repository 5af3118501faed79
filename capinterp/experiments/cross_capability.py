"""Erase one capability's neurons, test every capability (Huang et al. 2025, Fig. 5, erase half).

For each source capability, its CNL neurons (sigma 6, pooled half fits shared with the other
capability experiments) are zeroed and every capability's held-out metric is measured: the
relative drop ``(base - after) / base`` forms a source x target matrix. A seeded random neuron set
of the source's size is the control for each cell. The paper's Fig. 5 enhances and erases the
neurons of GSM8K, Emotion and Code25K and reports the change on the other datasets (e.g.
enhancing GSM8K's neurons improves Meta_Math by 22 %, with little effect elsewhere).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from capinterp.core.example import Example, as_examples
from capinterp.core.protocol import Model
from capinterp.experiments import capability_data as cd
from capinterp.experiments.base import Context, ExperimentResult, experiment
from capinterp.experiments.scoring import measure
from capinterp.interventions.hooks import erase
from capinterp.units import metrics
from capinterp.units.neurons import NeuronSet

__all__ = ["COLUMNS", "cross_figure", "cross_matrix", "cross_table", "run"]

NAME, TITLE = (
    "cross_capability",
    "Erasing one capability's neurons, measured on every capability (Huang et al. 2025, Fig. 5)",
)
COLUMNS = [
    "erased",
    "tested",
    "metric",
    "n_neurons",
    "set_overlap",
    "set_overlap_chance",
    "base",
    "after",
    "rel_drop",
    "after_random",
    "rel_drop_random",
]


def _rel(base: float, after: float) -> float:
    return (base - after) / base if base else float("nan")


def cross_table(
    model: Model,
    neurons: Mapping[str, NeuronSet],
    tests: Mapping[str, Sequence[Example]],
    *,
    metrics_by_name: Mapping[str, str] | None = None,
    random_control: bool = True,
    seed: int = 0,
    batch_size: int = 16,
    device: Any = None,
) -> pd.DataFrame:
    """Long table, one row per (erased, tested) pair: base, after erasing, relative drop, and the
    same for a random set of the erased set's size (seed ``seed``; NaN without ``random_control``).
    ``set_overlap`` is the overlap coefficient of the erased and the tested capability's neuron
    sets (NaN when the tested one has none in ``neurons``).

    Args:
        neurons: source capability -> located neurons to erase.
        tests: tested capability -> held-out examples (every source is tested on every one).
        metrics_by_name: capability -> ``"accuracy"`` / ``"target_prob"`` (the tested one's metric).
    """
    cd.on_device(model, device)
    metric = {t: (metrics_by_name or {}).get(t, cd.metric_for(t)) for t in tests}
    exs = {t: as_examples(v) for t, v in tests.items()}
    base = {t: measure(model, exs[t], metric[t], batch_size)["value"] for t in tests}
    rows = []
    for src, ns in neurons.items():
        rnd = ns.random_like(seed=seed) if random_control else None
        for t in tests:
            with erase(model, ns):
                after = measure(model, exs[t], metric[t], batch_size)["value"]
            after_r = float("nan")
            if rnd is not None:
                with erase(model, rnd):
                    after_r = measure(model, exs[t], metric[t], batch_size)["value"]
            ov = metrics.overlap(ns, neurons[t]) if t in neurons else float("nan")
            ov_chance = metrics.chance(ns, neurons[t]).expected if t in neurons else float("nan")
            rows.append(
                {
                    "erased": src,
                    "tested": t,
                    "metric": metric[t],
                    "n_neurons": len(ns),
                    "set_overlap": ov,
                    "set_overlap_chance": ov_chance,
                    "base": base[t],
                    "after": after,
                    "rel_drop": _rel(base[t], after),
                    "after_random": after_r,
                    "rel_drop_random": _rel(base[t], after_r),
                }
            )
    return pd.DataFrame(rows, columns=COLUMNS)


def cross_matrix(table: pd.DataFrame, value: str = "rel_drop") -> pd.DataFrame:
    """The wide source x target matrix of ``value`` (rows: erased, columns: tested), in input order."""
    rows, cols = list(dict.fromkeys(table["erased"])), list(dict.fromkeys(table["tested"]))
    return table.pivot(index="erased", columns="tested", values=value).reindex(index=rows, columns=cols)


def cross_figure(table: pd.DataFrame) -> go.Figure:
    """Two heatmaps of relative drop (%): erasing located neurons | erasing random ones."""
    fig = make_subplots(
        rows=1,
        cols=2,
        subplot_titles=("located neurons erased", "random neurons erased (control)"),
        horizontal_spacing=0.12,
    )
    for col, value in ((1, "rel_drop"), (2, "rel_drop_random")):
        m = 100 * cross_matrix(table, value)
        fig.add_trace(
            go.Heatmap(
                z=m.values,
                x=list(m.columns),
                y=list(m.index),
                zmin=-100,
                zmax=100,
                colorscale="RdBu_r",
                text=np.round(m.values, 1),
                texttemplate="%{text}",
                showscale=col == 2,
                colorbar_title="drop %",
                hovertemplate="erase %{y}, test %{x}: %{z:.1f}% drop<extra></extra>",
            ),
            1,
            col,
        )
        fig.update_xaxes(title_text="tested", row=1, col=col)
    fig.update_yaxes(title_text="erased", autorange="reversed", row=1, col=1)
    fig.update_yaxes(autorange="reversed", row=1, col=2)
    fig.update_layout(title="Relative drop after erasing one capability's CNL neurons (held-out examples)")
    return fig


@experiment(NAME, TITLE)
def run(ctx: Context) -> ExperimentResult:
    """Fig. 5 (erase half) on the capability datasets: CNL neurons at sigma 6."""
    s = cd.settings(ctx)
    data = cd.prepared(ctx, s)
    sigma = 6.0
    neurons = {
        k: cd.located_scores(ctx.localize, "cnl", d, ctx.seed, **s["params"]["cnl"]).select(sigma=sigma)
        for k, d in data.items()
    }
    table = cross_table(
        ctx.model,
        neurons,
        {k: d.test for k, d in data.items()},
        metrics_by_name={k: d.metric for k, d in data.items()},
        seed=ctx.seed,
        batch_size=ctx.batch_size,
    )
    diag = table[table["erased"] == table["tested"]]
    off = table[table["erased"] != table["tested"]]
    info = {
        "matrix_rel_drop": cross_matrix(table).round(4).to_dict(),
        "mean_rel_drop_own": float(diag["rel_drop"].mean()),
        "mean_rel_drop_other": float(off["rel_drop"].mean()) if len(off) else None,
        "mean_rel_drop_random": float(table["rel_drop_random"].mean()),
        "paper": "Fig. 5 enhances and erases the neurons of GSM8K, Emotion and Code25K and tests every dataset; "
        "the text quotes one number: enhancing GSM8K's neurons improves Meta_Math by 22% with little "
        "effect on the other datasets (the erase numbers are only in the figure, not in the text).",
        "settings": {**s, "capabilities": list(s["capabilities"]), "sigma": sigma},
        "notes": [
            "rel_drop = (base - after) / base in each tested capability's metric (accuracy or target_prob); "
            "the random control erases one seeded random set of the erased set's size.",
        ],
    }
    return ExperimentResult(
        NAME, TITLE, table, cross_figure(table), info, {f"cnl_{k}_sigma6": v for k, v in neurons.items()}
    )
