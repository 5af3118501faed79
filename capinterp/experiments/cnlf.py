"""CNLF: fine-tune only the capability neurons (the DCSN paper, anon. 2025, Sec. 6, Table 6).

The "+" block of Table 6, on generated arithmetic:

1. locate the DCSN neurons of one operator (default "+") on its 1-OP training set
   (``ctx.localize("dcsn", ...)``, sigma-masked; at least ``min_neurons`` by |score| when the
   mask finds fewer, e.g. on tiny test models);
2. fine-tune, each on its own copy of the model (:func:`capinterp.interventions.finetune`): only those neurons
   (CNLF, "Ours"), the same number of random neurons ("FT-Random"), every parameter ("FT-All"),
   and optionally every parameter but the located neurons, erased ("FT-w/o Cap", Table 2);
3. measure accuracy on unseen 1-OP problems of the operator (fitting score) and on 2-OP
   problems pairing it with each other operator (generalization: "+&-", "+&*", "+&/").

Differences from the paper: small models and datasets (a CPU budget; the time of
``capinterp reproduce --only cnlf`` is in docs/results.md, "Reproduction timings"), compact
few-shot prompts, learning rates of our choosing (the paper gives none; CNL used Adam 1e-5):
1e-4 for the neuron-level arms, 1e-5 for the whole-model arms (1e-4 on all of Gemma 3 270M
diverges: docs/results.md, "CNLF"), and no O-LoRA arm.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

import pandas as pd
import plotly.graph_objects as go

from capinterp.core.example import Example
from capinterp.data.arithmetic import arithmetic
from capinterp.experiments.base import Context, ExperimentResult, experiment
from capinterp.interventions.finetune import FinetuneResult, finetune
from capinterp.units.neurons import NeuronScores, NeuronSet

__all__ = ["FULL", "PAPER", "QUICK", "CNLFConfig", "cnlf", "cnlf_data", "cnlf_neurons", "cnlf_table", "run"]

LABELS = {
    "original": "Original",
    "located": "Ours (CNLF)",
    "random": "FT-Random",
    "without_located": "FT-w/o Cap",
    "full": "FT-All",
}
_COLS = ["+", "+&-", "+&*", "+&/"]
# the DCSN paper (anon. 2025), Table 6, "+" block: accuracy (%) on 1-OP "+" (fitting) and 2-OP sets with "+" (generalization).
PAPER: dict[str, Any] = {
    "table6_plus": {
        "LLaMA-2-7B": {
            "columns": _COLS,
            "Original": [52.41, 47.63, 43.65, 41.65],
            "FT-Random": [52.71, 48.07, 44.72, 42.67],
            "O-LoRA": [67.4, 49.77, 47.32, 44.97],
            "FT-All": [68.36, 49.86, 47.39, 45.36],
            "Ours": [67.83, 57.64, 58.83, 57.42],
        },
        "GPT-J-6B": {
            "columns": _COLS,
            "Original": [50.7, 47.31, 43.53, 39.41],
            "FT-Random": [50.92, 48.38, 44.37, 40.55],
            "O-LoRA": [64.89, 59.63, 46.55, 42.09],
            "FT-All": [66.93, 59.83, 47.29, 43.63],
            "Ours": [66.42, 66.81, 58.33, 53.37],
        },
    },
    # Table 2 enhancement, accuracy (%) averaged over + - * / (1-OP), 0.05% of parameters trained.
    "table2_enhance_avg": {
        "LLaMA-2-7B": {"Original": 47.8, "FT-Random": 48.3, "FT-w/o Cap": 52.8, "FT-Cap": 66.9},
        "GPT-J-6B": {"Original": 46.5, "FT-Random": 46.8, "FT-w/o Cap": 52.3, "FT-Cap": 66.1},
    },
    "param_share": 0.0005,
}


@dataclass(frozen=True)
class CNLFConfig:
    """Sizes and training settings of one CNLF run (``QUICK`` / ``FULL`` are the defaults)."""

    op: str = "+"
    gen_ops: str = "-*/"  # 2-OP generalization sets: op paired with each of these
    n_train: int = 48
    n_fit: int = 32
    n_gen: int = 24
    epochs: int = 2
    batch_size: int = 8
    lr: float = 1e-4  # the neuron-level arms (located, random)
    lr_full: float = 1e-5  # the whole-model arms (full, without_located): 1e-4 wrecks Gemma 3 270M
    sigma: float = 6.0
    min_neurons: int = 8
    arms: tuple[str, ...] = ("located", "random", "full")


QUICK = CNLFConfig(gen_ops="*", n_train=8, n_fit=8, n_gen=8, epochs=1)
_NEURON_ARMS = ("located", "random")
FULL = CNLFConfig()


def cnlf_data(cfg: CNLFConfig, seed: int = 0) -> tuple[list[Example], dict[str, list[Example]]]:
    """``(train, {set name: examples})``: 1-OP training problems, unseen 1-OP problems, 2-OP sets.

    Training and fitting problems are distinct expressions when the operator has enough of
    them (1 digit "+": 100); otherwise the fitting set is drawn independently (may overlap).
    """
    try:
        pool = arithmetic(cfg.op, n=cfg.n_train + cfg.n_fit, seed=seed, unique=True)
        train, fit = pool[: cfg.n_train], pool[cfg.n_train :]
    except ValueError:
        train = arithmetic(cfg.op, n=cfg.n_train, seed=seed)
        fit = arithmetic(cfg.op, n=cfg.n_fit, seed=seed + 1)
    sets = {cfg.op: fit}
    for other in cfg.gen_ops:
        if other != cfg.op:
            sets[f"{cfg.op}&{other}"] = arithmetic(cfg.op + other, n=cfg.n_gen, n_ops=2, seed=seed + 2)
    return train, sets


def cnlf_neurons(scores: NeuronScores, sigma: float, min_neurons: int) -> tuple[NeuronSet, str]:
    """The sigma-masked set, or the top ``min_neurons`` by |score| when the mask finds fewer."""
    ns = scores.select(sigma=sigma)
    if len(ns) >= min_neurons:
        return ns, f"sigma={sigma}"
    return scores.top_k(min_neurons, by="abs"), f"top-{min_neurons} |score| (sigma={sigma} found {len(ns)})"


def cnlf_table(ft: FinetuneResult, set_names: list[str]) -> pd.DataFrame:
    """Table 6 layout: one row per method (Original, then each arm after training), accuracy in %."""
    t = ft.table.set_index("arm")
    rows = []
    intact = [a for a in t.index if a != "without_located"]  # arms that start from the original model
    if intact:
        o = t.loc[intact[0]]
        rows.append(
            {
                "method": "original",
                "paper_name": LABELS["original"],
                "n_neurons": 0,
                "n_trainable_params": 0,
                "param_share": 0.0,
                "train_loss": o["train_loss_before"],
                **{s: 100 * o[f"{s}_acc_before"] for s in set_names},
            }
        )
    if "without_located" in t.index:
        w = t.loc["without_located"]
        rows.append(
            {
                "method": "erased",
                "paper_name": "located erased, untrained",
                "n_neurons": 0,
                "n_trainable_params": 0,
                "param_share": 0.0,
                "train_loss": w["train_loss_before"],
                **{s: 100 * w[f"{s}_acc_before"] for s in set_names},
            }
        )
    for arm, r in t.iterrows():
        rows.append(
            {
                "method": arm,
                "paper_name": LABELS[arm],
                "lr": r["lr"],
                "n_neurons": int(r["n_neurons"]),
                "n_trainable_params": int(r["n_trainable_params"]),
                "param_share": r["param_share"],
                "train_loss": r["train_loss_after"],
                **{s: 100 * r[f"{s}_acc_after"] for s in set_names},
                "s_per_epoch": r["s_per_epoch"],
            }
        )
    df = pd.DataFrame(rows)
    gen = set_names[1:]
    df["gen_avg"] = df[gen].mean(axis=1) if gen else float("nan")
    return df


def _figure(table: pd.DataFrame, set_names: list[str], title: str) -> go.Figure:
    fig = go.Figure()
    for _, r in table.iterrows():
        fig.add_trace(
            go.Bar(
                x=set_names,
                y=[r[s] for s in set_names],
                name=r["paper_name"],
                hovertemplate=f"{r['paper_name']}<br>%{{x}}: %{{y:.1f}}%<extra></extra>",
            )
        )
    fig.update_layout(
        barmode="group",
        title=title,
        yaxis_title="accuracy (%)",
        xaxis_title="fitting (1-OP) | generalization (2-OP)",
        height=420,
        width=760,
    )
    return fig


def cnlf(ctx: Context, **overrides: Any) -> ExperimentResult:
    """Run CNLF with ``QUICK``/``FULL`` (by ``ctx.quick``) updated by ``overrides`` (CNLFConfig fields)."""
    cfg = replace(QUICK if ctx.quick else FULL, **overrides)
    train, sets = cnlf_data(cfg, ctx.seed)
    scores = ctx.localize("dcsn", f"cnlf_{cfg.op}_train_s{ctx.seed}", train, sigma=cfg.sigma)
    neurons, selection = cnlf_neurons(scores, cfg.sigma, cfg.min_neurons)
    lrs = {a: cfg.lr if a in _NEURON_ARMS else cfg.lr_full for a in cfg.arms}
    ft = finetune(
        ctx.model,
        train,
        neurons=neurons,
        lr=lrs,
        epochs=cfg.epochs,
        arms=cfg.arms,
        eval_data=sets,
        batch_size=cfg.batch_size,
        seed=ctx.seed,
        eval_batch_size=ctx.batch_size,
        progress=ctx.progress,
    )
    names = list(sets)
    table = cnlf_table(ft, names)
    title = f"CNLF: fine-tuning the '{cfg.op}' DCSN neurons ({len(neurons)}) vs random neurons and all parameters"
    info = {
        "paper": PAPER,
        "config": {**asdict(cfg), "seed": ctx.seed, "quick": ctx.quick},
        "selection": selection,
        "n_neurons": len(neurons),
        "located_param_share": float(ft.table.set_index("arm")["param_share"].get("located", float("nan"))),
        "sets": {k: len(v) for k, v in sets.items()},
        "finetune_table": ft.table.to_dict("records"),
        "notes": "accuracy in %; first set = fitting score (unseen 1-OP problems), the rest = generalization "
        "(2-OP). lr: config.lr for located/random, config.lr_full for full/without_located; "
        "no O-LoRA arm.",
    }
    if ctx.quick:
        info["quick_note"] = (
            "one training step per arm: Adam's first step moves every trained entry by ~lr, "
            "which transiently hurts whole-model fine-tuning; the full run trains longer"
        )
    return ExperimentResult("cnlf", title, table, _figure(table, names, title), info, dict(ft.neurons))


@experiment(
    "cnlf",
    "CNLF: capability-neuron fine-tuning vs random neurons and full fine-tuning (the DCSN paper, anon. 2025, Table 6)",
)
def run(ctx: Context) -> ExperimentResult:
    """The registered experiment: :func:`cnlf` with the default settings."""
    return cnlf(ctx)
