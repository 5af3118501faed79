"""Forward reasoning and reverse validation on multi-operator expressions (the DCSN paper, anon. 2025, Table 4).

Forward (Eq. 4): for each 2- to 5-OP expression ``d_i``, the activated set ``A_i``
is the sigma mask (Eq. 2) of the single-sample DCSN score ``C(., ., t_i, {d_i})``, and

    R_i = mean_{o in ops(d_i)} |N_o ∩ A_i| / |N_o|,       R = mean_i R_i

(averaged over the operators present, so R is a fraction). Beside it: ``R_absent`` (the same
over operators *not* in the expression, where there are any) and ``chance`` = |A_i| / (L d_mlp),
the expected R of a random set (L d_mlp: the model's real neurons where layers differ in width).
Operators with an empty set ``N_o`` are skipped.

Reverse (5.5): erase the top ``fraction`` (10%) by |C - mean| of the sets of the operators
present, against a random set of the same size (seeded), and report accuracy and mean target
probability (accuracy on multi-operator items is low for small models).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
import torch

from capinterp.arch.model import valid_neurons
from capinterp.core.example import Example
from capinterp.core.protocol import Model
from capinterp.data import arithmetic
from capinterp.experiments.base import Context, ExperimentResult, experiment
from capinterp.experiments.dcsn_common import (
    OP_NAMES,
    OPS,
    context_scorer,
    operator_neurons,
    sample_scores,
    top_fraction,
    union,
)
from capinterp.interventions.hooks import erase
from capinterp.kernels.evaluate import evaluate
from capinterp.units.neurons import NeuronSet

__all__ = [
    "PAPER",
    "TITLE",
    "activation_mask",
    "activation_ratio",
    "forward_reasoning_table",
    "operator_ratio",
    "reverse_validation",
    "run",
]

TITLE = "Capability-specific neurons (DCSN paper, anon. 2025): forward reasoning and reverse validation"
PAPER = {  # Table 4, LLaMA-2-7B, DG rows, percent
    "forward_R_DG": {"2-OP": 94.37, "3-OP": 89.67, "4-OP": 87.43, "5-OP": 86.66, "avg": 89.53},
    "reverse_original": {"2-OP": 60.25, "3-OP": 56.47, "4-OP": 54.29, "5-OP": 54.17},
    "reverse_random": {"2-OP": 60.27, "3-OP": 56.21, "4-OP": 54.20, "5-OP": 53.07},
    "reverse_erased": {"2-OP": 32.07, "3-OP": 30.49, "4-OP": 27.31, "5-OP": 27.78},
}


def activation_mask(scores: torch.Tensor, sigma: float = 6.0, valid: torch.Tensor | None = None) -> torch.Tensor:
    """Per-sample Eq. 2 mask of ``[b, n_layers, d_mlp]`` scores: |C - mean| > sigma * std (population).

    ``valid`` (bool ``[n_layers, d_mlp]``, :func:`capinterp.arch.model.valid_neurons`): the model's
    real neurons; mean and std are then taken over them only and padding is never active."""
    flat = scores.double().flatten(1)
    if valid is None or bool(valid.all()):
        mean = flat.mean(1, keepdim=True)
        std = flat.std(1, correction=0, keepdim=True)
        return ((flat - mean).abs() > sigma * std).view(scores.shape)
    real = valid.flatten().to(flat.device)
    mean = flat[:, real].mean(1, keepdim=True)
    std = flat[:, real].std(1, correction=0, keepdim=True)
    return (((flat - mean).abs() > sigma * std) & real).view(scores.shape)


def _share(active: torch.Tensor, n_real: int) -> float:
    """|A_i| / (the model's real neurons): the expected R of a random set (padding is no neuron)."""
    return float(active.float().mean()) if n_real == active.numel() else int(active.sum()) / n_real


def operator_ratio(active: torch.Tensor, sets: Mapping[str, NeuronSet], ops: Sequence[str]) -> float:
    """mean_{o in ops} |N_o ∩ active| / |N_o| over operators with a non-empty set (NaN if none)."""
    fr = [float((active & sets[o].mask).sum()) / len(sets[o]) for o in ops if o in sets and len(sets[o])]
    return float(np.mean(fr)) if fr else float("nan")


def activation_ratio(
    model: Model,
    examples: Sequence[Example],
    op_sets: Mapping[str, NeuronSet],
    *,
    sigma: float = 6.0,
    batch_size: int = 16,
) -> pd.DataFrame:
    """One row per example: n_ops, ops, R, R_absent, n_active, chance (see the module docstring)."""
    rows: list[dict[str, Any]] = []
    valid = valid_neurons(model)
    n_real = int(valid.sum())
    for idx, scores, _ in sample_scores(model, examples, batch_size):
        active = activation_mask(scores, sigma, valid)
        for j, i in enumerate(idx):
            present = list(examples[i].meta["op_set"])
            absent = [o for o in op_sets if o not in present]
            rows.append(
                {
                    "index": i,
                    "n_ops": examples[i].meta["n_ops"],
                    "ops": "".join(present),
                    "R": operator_ratio(active[j], op_sets, present),
                    "R_absent": operator_ratio(active[j], op_sets, absent),
                    "n_active": int(active[j].sum()),
                    "chance": _share(active[j], n_real),
                }
            )
    return pd.DataFrame(rows)


def reverse_validation(
    model: Model,
    examples: Sequence[Example],
    erase_sets: Mapping[str, NeuronSet],
    *,
    seed: int = 0,
    batch_size: int = 16,
) -> pd.DataFrame:
    """Per group of examples with the same operator set: accuracy and mean p(target) of the
    original model, with the union of the present operators' ``erase_sets`` zeroed, and with a
    random set of the same size zeroed (``random_like(seed)``)."""
    groups: dict[str, list[int]] = defaultdict(list)
    for i, e in enumerate(examples):
        groups["".join(e.meta["op_set"])].append(i)
    like = next(iter(erase_sets.values()))
    base = evaluate(model, examples, batch_size=batch_size, progress=False).records
    rows = []
    for ops, idx in groups.items():
        items = [examples[i] for i in idx]
        target = union([erase_sets[o] for o in ops if o in erase_sets], like)
        control = target.random_like(seed)
        row: dict[str, Any] = {"ops": ops, "n": len(idx), "n_erased": len(target)}
        row["acc_orig"] = float(np.mean([base[i]["correct"] for i in idx]))
        row["prob_orig"] = float(np.mean([base[i]["prob"] for i in idx]))
        for arm, ns in (("erased", target), ("random", control)):
            with erase(model, ns):
                r = evaluate(model, items, batch_size=batch_size, progress=False)
            row[f"acc_{arm}"], row[f"prob_{arm}"] = r.accuracy, r.mean_prob
        rows.append(row)
    return pd.DataFrame(rows)


def forward_reasoning_table(
    model: Model,
    datasets: Mapping[int, list[Example]],
    op_sets: Mapping[str, NeuronSet],
    erase_sets: Mapping[str, NeuronSet],
    *,
    sigma: float = 6.0,
    seed: int = 0,
    batch_size: int = 16,
) -> pd.DataFrame:
    """One row per operator count k: R, R_absent, chance (%), and the reverse-validation arms (%)."""
    rows = []
    for k, examples in sorted(datasets.items()):
        fwd = activation_ratio(model, examples, op_sets, sigma=sigma, batch_size=batch_size)
        rev = reverse_validation(model, examples, erase_sets, seed=seed, batch_size=batch_size)
        w = rev["n"] / rev["n"].sum()
        row: dict[str, Any] = {
            "n_ops": k,
            "n": len(examples),
            "R": 100 * fwd["R"].mean(),
            "R_absent": 100 * fwd["R_absent"].mean(),
            "chance": 100 * fwd["chance"].mean(),
            "n_active": fwd["n_active"].mean(),
            "n_erased": float((rev["n_erased"] * w).sum()),
        }
        for col in ("acc_orig", "acc_erased", "acc_random", "prob_orig", "prob_erased", "prob_random"):
            row[col] = 100 * float((rev[col] * w).sum())
        rows.append(row)
    return pd.DataFrame(rows)


def _figure(table: pd.DataFrame) -> Any:
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    x = [f"{k}-OP" for k in table["n_ops"]]
    fig = make_subplots(
        rows=1, cols=2, subplot_titles=("forward: activation ratio R (%)", "reverse: accuracy / mean p(target) (%)")
    )
    for col, name in (("R", "R (ops present)"), ("R_absent", "R (ops absent)"), ("chance", "chance")):
        fig.add_trace(go.Bar(x=x, y=table[col], name=name), row=1, col=1)
    for arm in ("orig", "random", "erased"):
        fig.add_trace(go.Bar(x=x, y=table[f"acc_{arm}"], name=f"accuracy {arm}"), row=1, col=2)
        fig.add_trace(
            go.Scatter(x=x, y=table[f"prob_{arm}"], name=f"p(target) {arm}", mode="lines+markers"), row=1, col=2
        )
    fig.update_layout(barmode="group", title=TITLE)
    return fig


@experiment("forward_reasoning", TITLE)
def run(ctx: Context) -> ExperimentResult:
    """The registered experiment: forward reasoning and reverse validation on the context's model."""
    sigma, fraction = 6.0, 0.1
    n_loc, n_test = ctx.size(6, 50), ctx.size(2, 20)
    scores, sets = operator_neurons(context_scorer(ctx), n_loc, ctx.seed, sigma)
    tops = {op: top_fraction(scores[op], sets[op], fraction) for op in OPS}
    data = {
        k: arithmetic(ops="".join(OPS), n=n_test, fmt="DG", lang="en", seed=ctx.seed + 1, n_ops=k) for k in range(2, 6)
    }
    table = forward_reasoning_table(ctx.model, data, sets, tops, sigma=sigma, seed=ctx.seed, batch_size=ctx.batch_size)
    info = {
        "paper": PAPER,
        "measured_R_avg": round(float(table["R"].mean()), 2),
        "set_sizes": {op: len(s) for op, s in sets.items()},
        "located_per_layer": {op: s.per_layer().tolist() for op, s in sets.items()},
        "erased_per_operator": {op: len(s) for op, s in tops.items()},
        "sigma": sigma,
        "fraction": fraction,
        "n_localize_per_op": n_loc,
        "n_test_per_k": n_test,
        "notes": (
            "Operator neurons: DCSN on 1-OP DG (en, compact) examples with a right first token, "
            f"seed {ctx.seed}; test expressions: seed {ctx.seed + 1}. R averages |N_o ∩ A_i|/|N_o| over "
            "the operators present; R_absent over the others; chance = |A_i|/(L*d_mlp). Reverse: "
            "erase the top 10% (|C-mean|) of the present operators' sets vs a same-size random set."
        ),
    }
    neurons = {f"{OP_NAMES[op]}_top{int(100 * fraction)}": s for op, s in tops.items()}
    return ExperimentResult("forward_reasoning", TITLE, table, _figure(table), info, neurons)
