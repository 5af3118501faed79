"""Enhancing a capability by fine-tuning only its neurons (Huang et al. 2025, Table 2).

Per capability, the CNL neurons located for :mod:`~capinterp.experiments.erase` (sigma 6, the
pooled half fits of :mod:`~capinterp.experiments.commonality`) are fine-tuned on the
localization examples (train split) with :func:`capinterp.interventions.finetune`, against the paper's two
controls: the same number of random neurons, and every other parameter with the located neurons
zeroed ("w/o located"). Each arm is measured on the held-out test examples in the capability's
metric (greedy accuracy or target probability), as erase does.

Learning rates: 3e-5 for the neuron-level arms, 1e-5 for "w/o located" (1e-4 on a whole 270M
model wrecks it, see :mod:`~capinterp.experiments.cnlf`). Measured on Gemma 3 270M (CNL sets of
~120 neurons, 24 training examples, 2 epochs, 32 held-out examples), located arm after training,
sub / sentiment accuracy (base 50.0 / 62.5 %): 1e-5 46.9 / 50.0 %, 3e-5 59.4 / 65.6 %, 1e-4
40.6 / 68.8 %; the random arm stays within 3-9 points of base at every rate.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd
import plotly.graph_objects as go

from capinterp.core.example import Example, as_examples
from capinterp.core.protocol import Model
from capinterp.experiments import capability_data as cd
from capinterp.experiments.base import Context, ExperimentResult, experiment
from capinterp.experiments.scoring import measure
from capinterp.interventions.finetune import finetune
from capinterp.units.neurons import NeuronSet

__all__ = [
    "ARMS",
    "CAPABILITIES",
    "LR",
    "PAPER_TABLE2",
    "QUICK_CAPABILITIES",
    "columns",
    "enhance_figure",
    "enhance_table",
    "run",
]

NAME, TITLE = "enhance", "Fine-tuning capability neurons vs random neurons and the rest (Huang et al. 2025, Table 2)"
ARMS: tuple[str, ...] = ("located", "random", "without_located")
LR: dict[str, float] = {"located": 3e-5, "random": 3e-5, "without_located": 1e-5}
#: One arithmetic and one text capability (the full run): every arm trains a copy of the model
#: and the whole-model arm is costly (all seven capabilities with it ran over an hour on one
#: CPU thread); the located sets are the erase experiment's, shared through the fit cache.
CAPABILITIES: tuple[str, ...] = ("sub", "sentiment")
#: Quick mode trains the three arms on one capability (three trained copies of the model per
#: capability); the full run on :data:`CAPABILITIES`.
QUICK_CAPABILITIES: tuple[str, ...] = ("sub",)
#: Huang et al. 2025, Table 2 (Llama2-7B, first block; accuracy %): GSM8K, Emotion, Code25K, average.
PAPER_TABLE2: dict[str, Any] = {
    "columns": ["GSM8K", "Emotion", "Code25K", "avg"],
    "Llama2-7B": {
        "random": [0.00, 14.62, 52.79, 22.47],
        "without_located": [25.35, 19.06, 44.43, 28.95],
        "located": [24.52, 23.57, 54.28, 34.12],
    },
    "GPTJ-6B": {
        "random": [0.00, 5.71, 50.81, 18.84],
        "without_located": [23.31, 31.00, 43.73, 32.68],
        "located": [24.75, 28.00, 51.48, 34.74],
    },
    "param_share_pct": 0.15,
}


def columns(arms: Sequence[str] = ARMS) -> list[str]:
    """The table's columns for these arms."""
    return [
        "capability",
        "metric",
        "n_neurons",
        "param_share_pct",
        "n_train",
        "n_test",
        "epochs",
        "base",
        *arms,
        *(f"gain_{a}" for a in arms),
        "base_prob",
        *(f"{a}_prob" for a in arms),
    ]


def enhance_table(
    model: Model,
    neurons: Mapping[str, NeuronSet],
    train: Mapping[str, Sequence[Example]],
    tests: Mapping[str, Sequence[Example]],
    *,
    metrics_by_name: Mapping[str, str] | None = None,
    epochs: int = 2,
    lr: Mapping[str, float] = LR,
    arms: Sequence[str] = ARMS,
    seed: int = 0,
    batch_size: int = 16,
) -> pd.DataFrame:
    """One row per capability: the metric before and after fine-tuning each arm, and the gains.

    Args:
        neurons: capability -> located neurons (non-empty).
        train: capability -> training examples.
        tests: capability -> held-out examples.
        metrics_by_name: capability -> ``"accuracy"`` / ``"target_prob"`` (default by name).
        arms: any of :data:`ARMS`; the random arm draws ``neurons.random_like(seed)``.
    """
    rows = []
    for name, ns in neurons.items():
        exs, metric = as_examples(tests[name]), (metrics_by_name or {}).get(name, cd.metric_for(name))
        base = measure(model, exs, metric, batch_size)
        ft = finetune(
            model,
            train[name],
            neurons=ns,
            lr={a: lr[a] for a in arms},
            epochs=epochs,
            arms=arms,
            seed=seed,
            keep_models=True,
            eval_batch_size=batch_size,
            progress=False,
        )
        after = {a: measure(ft.models[a], exs, metric, batch_size) for a in arms}
        ft.models.clear()  # free the trained copies
        share = ft.table.set_index("arm")["param_share"]
        rows.append(
            {
                "capability": name,
                "metric": metric,
                "n_neurons": len(ns),
                "param_share_pct": 100 * float(share.get("located", float("nan"))),
                "n_train": len(train[name]),
                "n_test": len(exs),
                "epochs": epochs,
                "base": base["value"],
                **{a: after[a]["value"] for a in arms},
                **{f"gain_{a}": after[a]["value"] - base["value"] for a in arms},
                "base_prob": base["prob"],
                **{f"{a}_prob": after[a]["prob"] for a in arms},
            }
        )
    return pd.DataFrame(rows, columns=columns(arms))


def enhance_figure(table: pd.DataFrame, arms: Sequence[str] = ARMS) -> go.Figure:
    """Grouped bars per capability: the metric before and after fine-tuning each arm."""
    fig = go.Figure()
    for col, label in [("base", "original"), *((a, a.replace("_", " ")) for a in arms)]:
        fig.add_bar(
            x=table["capability"],
            y=table[col],
            name=label,
            customdata=table[["metric"]],
            hovertemplate=f"{label}<br>%{{x}}: %{{customdata[0]}} %{{y:.3f}}<extra></extra>",
        )
    fig.update_layout(
        barmode="group",
        title="Fine-tuning located vs random neurons vs the rest (held-out examples)",
        yaxis_title="metric (accuracy or target probability)",
        height=420,
    )
    return fig


@experiment(NAME, TITLE)
def run(ctx: Context) -> ExperimentResult:
    """Table 2 on the capability datasets, with the erase experiment's located sets (sigma 6)."""
    s = {**cd.settings(ctx), "capabilities": ctx.size(QUICK_CAPABILITIES, CAPABILITIES)}
    data = cd.prepared(ctx, s)
    neurons = {
        k: cd.located_scores(ctx.localize, "cnl", d, ctx.seed, **s["params"]["cnl"]).select(sigma=6.0)
        for k, d in data.items()
    }
    empty = [k for k, ns in neurons.items() if len(ns) == 0]
    neurons = {k: ns for k, ns in neurons.items() if len(ns)}
    epochs = ctx.size(1, 2)
    table = enhance_table(
        ctx.model,
        neurons,
        {k: data[k].locate for k in neurons},
        {k: data[k].test for k in neurons},
        metrics_by_name={k: d.metric for k, d in data.items()},
        epochs=epochs,
        seed=ctx.seed,
        batch_size=ctx.batch_size,
    )
    info = {
        "paper": {"table2_pct": PAPER_TABLE2},
        "mean_gain": {a: float(table[f"gain_{a}"].mean()) for a in ARMS},
        "located_beats_random": int((table["located"] > table["random"]).sum()),
        "located_beats_without_located": int((table["located"] > table["without_located"]).sum()),
        "n_capabilities": len(table),
        "skipped_empty_sets": empty,
        "settings": {**s, "capabilities": list(s["capabilities"]), "sigma": 6.0, "epochs": epochs, "lr": LR},
        "notes": [
            "base/arms are fractions in each capability's metric on held-out test examples; gain_* = arm - base.",
            "Trained on the localization examples (the pooled commonality halves); lr 3e-5 for the neuron arms, "
            "1e-5 for w/o located (every other parameter, located neurons zeroed).",
        ],
    }
    if ctx.quick:
        info["quick_note"] = (
            f"one capability ({', '.join(QUICK_CAPABILITIES)}), two training steps per arm: Adam's first "
            "steps move every trained entry by ~lr, which can transiently hurt; the full run trains "
            f"{' and '.join(CAPABILITIES)}, 2 epochs on twice the data"
        )
    return ExperimentResult(NAME, TITLE, table, enhance_figure(table), info, neurons)
