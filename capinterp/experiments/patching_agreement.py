"""Do attribution scores agree with exact activation patching? (the RelP / AtP* question)

For a set of units, the exact effect of unit u is the drop of the metric (mean p(target's first
token) over the data) when u alone is ablated (zero, the IG baseline; or mean) at every position:
``effect(u) = m(N) - m(N without u)``. An attribution method predicts it with its score. Per
component type, this reports the Pearson and Spearman correlation between the two over:

* FFN **neurons**: the top ``n_top`` neurons of each method by |score| plus ``n_random``
  uniformly random neurons (seeded), each ablated alone;
* FFN **layers**: every layer's neurons ablated together, against the sum of the layer's scores;
* **attention heads**: every head's output (``z_h @ W_O[h]``) ablated alone, against attribution
  patching (AtP: ``(a_h - ref_h) . dm/da_h``), both from :mod:`capinterp.circuits.head_patching`.

Methods: KN's IG (summed over the task's prompts; CNL's IG is the same quantity on one-token
answers) and DCSN (activation x unembedding projection) for neurons and layers; AtP, RelP and AtP*'s
attention-saturation (QK) fix for heads; for **circuit edges** (facts with subject swaps), EAP and
EAP-IG against exact single-edge patching with the corrupted run's value
(:mod:`capinterp.experiments.edge_agreement`). AtP*'s GradDrop is unsigned (a mean of absolute
per-prompt estimates): its row, and the ``|AtP|`` row beside it on the same footing, are correlated with
the magnitude of the exact effect. RelP (Jafari et al. 2025: AtP whose backward pass uses LRP rules,
:mod:`capinterp.circuits.relp`) is signed, against the exact effect.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import torch

from capinterp.arch.family import UnsupportedFamily, family_of
from capinterp.arch.model import attention_layers, neuron_shape, valid_neurons
from capinterp.circuits.head_patching import head_atp, head_atp_graddrop, head_atp_qk, head_effects
from capinterp.circuits.relp import head_relp
from capinterp.core.protocol import Model
from capinterp.experiments.base import Context, ExperimentResult, experiment
from capinterp.experiments.edge_agreement import edge_rows, edge_table
from capinterp.experiments.faithfulness import sub_and_facts
from capinterp.interventions.faithfulness import ablated_metric
from capinterp.units.neurons import NeuronScores

__all__ = ["COLUMNS", "agreement_table", "correlations", "head_table", "run", "unit_effects"]

NAME, TITLE = (
    "patching_agreement",
    "Attribution scores against exact activation patching (neurons, FFN layers, heads, edges)",
)
COLUMNS = ["task", "component", "method", "pearson", "spearman", "n_units", "ablation"]


def _ranks(x: np.ndarray) -> np.ndarray:
    """Average ranks (ties share their mean rank), as Spearman's coefficient needs."""
    order = np.argsort(x, kind="stable")
    ranks = np.empty(len(x))
    ranks[order] = np.arange(len(x), dtype=float)
    for v in np.unique(x):
        tie = x == v
        ranks[tie] = ranks[tie].mean()
    return ranks


def correlations(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """(Pearson, Spearman) of two samples; NaN where either is constant."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if len(a) < 2 or a.std() == 0 or b.std() == 0:
        return float("nan"), float("nan")
    ra, rb = _ranks(a), _ranks(b)
    spearman = float(np.corrcoef(ra, rb)[0, 1]) if ra.std() and rb.std() else float("nan")
    return float(np.corrcoef(a, b)[0, 1]), spearman


def unit_effects(model: Model, data: Any, groups: list[torch.Tensor], ablation: str = "zero", batch_size: int = 16):
    """``[len(groups)]`` exact effects: m(full) - m(the group's neurons ablated), a group being a
    bool ``[n_layers, d_mlp]`` mask; all groups run as rows of the same batches."""
    L, d = neuron_shape(model)
    keep = torch.ones(len(groups) + 1, L, d, dtype=torch.bool)
    for i, g in enumerate(groups):
        keep[i + 1] = ~g
    vals = ablated_metric(model, data, keep, ablation=ablation, batch_size=batch_size)
    return vals[0] - vals[1:]


def agreement_table(
    model: Model,
    task: str,
    data: list,
    scores: dict[str, NeuronScores],
    *,
    n_top: int = 16,
    n_random: int = 16,
    ablation: str = "zero",
    seed: int = 0,
    batch_size: int = 16,
) -> pd.DataFrame:
    """Rows per (component, method) for one task; ``scores``: method -> NeuronScores on ``data``."""
    L, d = neuron_shape(model)
    real = valid_neurons(model).flatten()  # padding neurons (past a dense layer's width) are no units
    pool = real.nonzero().flatten()
    gen = torch.Generator().manual_seed(int(seed))
    picked = set(pool[torch.randperm(pool.numel(), generator=gen)[:n_random]].tolist())
    for s in scores.values():
        key = s.scores.flatten().abs().masked_fill(~real, -torch.inf)
        picked |= set(torch.sort(key, descending=True).indices[: min(n_top, pool.numel())].tolist())
    neurons = sorted(picked)
    groups = []
    for u in neurons:
        g = torch.zeros(L * d, dtype=torch.bool)
        g[u] = True
        groups.append(g.view(L, d))
    layer_groups = [torch.zeros(L, d, dtype=torch.bool).index_fill_(0, torch.tensor([l]), True) for l in range(L)]
    effects = unit_effects(model, data, groups + layer_groups, ablation, batch_size)
    neuron_effect, layer_effect = effects[: len(groups)], effects[len(groups) :]
    rows = []
    for method, s in scores.items():
        flat = s.scores.flatten().double().numpy()
        for component, effect, predicted in (
            ("FFN neuron", neuron_effect, flat[neurons]),
            ("FFN layer", layer_effect, s.scores.double().sum(1).numpy()),
        ):
            pearson, spearman = correlations(predicted, effect)
            rows.append(
                {
                    "task": task,
                    "component": component,
                    "method": method,
                    "pearson": pearson,
                    "spearman": spearman,
                    "n_units": len(effect),
                    "ablation": ablation,
                }
            )
    return pd.DataFrame(rows, columns=COLUMNS)


def head_table(
    model: Model,
    task: str,
    data: list,
    *,
    ablation: str = "zero",
    qk_fix: bool = True,
    graddrop: bool = True,
    relp: bool = True,
    batch_size: int = 16,
) -> pd.DataFrame:
    """Rows for component ``"attention head"``: AtP (and, with ``qk_fix``, AtP*'s attention-saturation
    fix where the model's graph has q/k slots) against exact single-head patching, every head (of the
    attention layers, on a hybrid model); with
    ``relp``, RelP (AtP with LRP rules in the backward pass, :mod:`capinterp.circuits.relp`); with
    ``graddrop``, AtP*'s GradDrop and ``|AtP|`` against ``|exact|`` (GradDrop is unsigned)."""
    exact = head_effects(model, data, ablation=ablation, batch_size=batch_size)
    has_heads = np.zeros(exact.shape, dtype=bool)  # a hybrid model's layers without attention: NaN rows
    has_heads[attention_layers(model)] = True
    heads = has_heads.ravel()
    exact = exact.ravel()[heads]
    atp = head_atp(model, data, ablation=ablation, batch_size=batch_size).ravel()[heads]
    methods = {"AtP": (atp, exact)}
    if relp:
        try:
            methods["RelP"] = (head_relp(model, data, ablation=ablation, batch_size=batch_size).ravel()[heads], exact)
        except UnsupportedFamily:
            if not family_of(model).hybrid_layers:
                raise
            # no RelP rule for a hybrid model's mixers: AtP and its corrections only
    if qk_fix:
        try:
            qk = head_atp_qk(model, data, ablation=ablation, batch_size=batch_size).ravel()[heads]
            methods["AtP* (QK fix)"] = (qk, exact)
        except NotImplementedError:
            pass  # no per-head q/k inputs on this family (granularity "layer"): AtP only
    if graddrop:
        gd = head_atp_graddrop(model, data, ablation=ablation, batch_size=batch_size).ravel()[heads]
        methods["|AtP| vs |effect|"] = (np.abs(atp), np.abs(exact))
        methods["AtP* (GradDrop) vs |effect|"] = (gd, np.abs(exact))
    rows = []
    for method, (scores, target) in methods.items():
        pearson, spearman = correlations(scores, target)
        rows.append(
            {
                "task": task,
                "component": "attention head",
                "method": method,
                "pearson": pearson,
                "spearman": spearman,
                "n_units": len(exact),
                "ablation": ablation,
            }
        )
    return pd.DataFrame(rows, columns=COLUMNS)


def _figure(table: pd.DataFrame) -> go.Figure:
    fig = go.Figure()
    for method, g in table.groupby("method", sort=False):
        fig.add_bar(x=g["task"] + " / " + g["component"], y=g["pearson"], name=f"{method} (Pearson)")
    fig.update_layout(
        title="Attribution against exact activation patching (Pearson r)", yaxis_range=[-1, 1], template="plotly_white"
    )
    return fig


@experiment(NAME, TITLE)
def run(ctx: Context) -> ExperimentResult:
    """KN's IG and DCSN (neurons, layers) and AtP (heads) against single-unit zero ablation on
    arithmetic (``sub``) and known facts."""
    from capinterp.localizers.dcsn import DCSN
    from capinterp.localizers.kn import KN

    sub, facts = sub_and_facts(ctx, ctx.size(4, 12))
    tasks = {"arithmetic (sub)": sub.locate[: ctx.size(4, 16)]}
    if facts:
        tasks["facts"] = facts
    ig = ctx.ig(4, 10)
    parts, edge_facts = [], 0
    for task, data in tasks.items():
        key = f"patch_{task.split()[0]}_n{len(data)}"

        def kn(data: list = data) -> NeuronScores:
            return KN(ctx.model, steps=ig["steps"], rule=ig["rule"], progress=False).fit(data).scores_

        def dcsn(data: list = data) -> NeuronScores:
            return DCSN(ctx.model, progress=False).fit(data).scores_

        scores = {
            "kn (IG)": ctx.scores(f"{key}_kn_{ig['rule']}{ig['steps']}", kn),
            "dcsn": ctx.scores(f"{key}_dcsn", dcsn),
        }
        parts.append(
            agreement_table(
                ctx.model, task, data, scores, n_top=ctx.size(8, 32), n_random=ctx.size(8, 32), seed=ctx.seed
            )
        )
        # AtP*'s QK fix costs a forward per (head, later layer): the full run only; GradDrop costs one
        # backward per layer and batch, cheaper than the exact per-head ablations: both variants
        parts.append(head_table(ctx.model, task, data, qk_fix=not ctx.quick))
        if task == "facts":  # edges need subject swaps (corrupted runs); none on arithmetic
            n = ctx.size(8, 32)
            found = edge_table(ctx.model, data, ig, n_top=n, n_random=n, seed=ctx.seed, batch_size=ctx.batch_size)
            if found is not None:
                parts.append(edge_rows(task, found, correlations))
                edge_facts = found[3]
    table = pd.concat(parts, ignore_index=True)
    info: dict[str, Any] = {
        "edge_facts": edge_facts,  # facts with a subject swap among them (the edge rows' data)
        "notes": (
            "effect = drop of mean p(target) when the unit alone is zero-ablated at every position; "
            "neurons: each method's top by |score| plus random ones; layers: all of a layer's neurons against "
            "the sum of its scores; heads: every head's output zero-ablated alone against AtP "
            "((a - 0) . dm/da through the circuit graph), RelP (the same with LRP rules in the backward pass: "
            "LN-rule, identity rule on the MLP activation, half rule on a gated product, attention pattern held "
            "constant; Jafari et al. 2025), AtP* with the QK fix (later attention patterns "
            "recomputed with the head ablated in their q/k inputs; full run only) and AtP*'s GradDrop (mean over "
            "prompts of (1/(L-1)) sum over layers l of |AtP with no gradient through block l|, Kramar et al. 2024 "
            "eq. 11; unsigned, so it and |AtP| are correlated with |effect|); circuit edges (facts): EAP / EAP-IG scores "
            "against the exact change of logit[answer] - logit[swapped subject's answer] when one edge carries the "
            "subject-swapped run's value (each method's top edges by |score| plus random ones). RelP paper (GPT-2 small MLPs): attribution patching 0.195, RelP 0.992 "
            "(Pearson against activation patching)."
        ),
    }
    return ExperimentResult(NAME, TITLE, table, _figure(table), info)
