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

from functools import partial
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import torch

from capinterp.arch.family import UnsupportedFamily, family_of
from capinterp.arch.model import attention_layers, neuron_shape, valid_neurons
from capinterp.circuits.eap import make_pairs
from capinterp.circuits.head_patching import head_atp, head_atp_graddrop, head_atp_qk, head_effects
from capinterp.circuits.relp import head_relp
from capinterp.core import validate
from capinterp.core.protocol import Model
from capinterp.core.tokens import encode
from capinterp.experiments import capability_data as cd
from capinterp.experiments.agreement_stats import CI_COLUMNS, correlations, stat_row
from capinterp.experiments.base import Context, ExperimentResult, experiment
from capinterp.experiments.corrupt_partners import partner_fn, partners
from capinterp.experiments.edge_agreement import edge_rows, edge_table
from capinterp.experiments.faithfulness import FULL_FACTS, FULL_PROBLEMS, fact_bags, sub_and_facts
from capinterp.experiments.neuron_atp import neuron_atp
from capinterp.experiments.unit_stair import stair_effects
from capinterp.interventions.faithfulness import ablated_metric
from capinterp.units.neurons import NeuronScores

__all__ = ["ABLATIONS", "COLUMNS", "agreement_table", "correlations", "head_table", "run", "unit_effects"]

NAME, TITLE = (
    "patching_agreement",
    "Attribution scores against exact activation patching (neurons, FFN layers, heads, edges)",
)
COLUMNS = ["task", "component", "method", *CI_COLUMNS, "n_units", "ablation"]
#: the references a unit is patched to: 0, or its value on the example's corrupted prompt
ABLATIONS = ("zero", "corrupted")


def unit_effects(
    model: Model,
    data: Any,
    groups: list[torch.Tensor],
    ablation: str = "zero",
    batch_size: int = 16,
    corrupt: Any = None,
):
    """``[len(groups)]`` exact effects: m(full) - m(the group's neurons ablated), a group being a
    bool ``[n_layers, d_mlp]`` mask; all groups run as rows of the same batches. ``ablation="corrupt"``
    with ``corrupt`` (an example -> its corrupted example) patches them to the corrupted prompt's values."""
    L, d = neuron_shape(model)
    keep = torch.ones(len(groups) + 1, L, d, dtype=torch.bool)
    for i, g in enumerate(groups):
        keep[i + 1] = ~g
    extra = {} if corrupt is None else {"corrupt": corrupt}
    vals = ablated_metric(model, data, keep, ablation=ablation, batch_size=batch_size, **extra)
    return vals[0] - vals[1:]


def _effects(model: Model, data: list, src: list, groups: list, abl: str, partner: Any, batch_size: int):
    """:func:`unit_effects` through the stair (:mod:`capinterp.experiments.unit_stair`: the layers
    below each unit's reused, the answer position's logits only) where the model allows it."""
    pairs = src if abl == "corrupt" else None
    items = [p.clean for p in src] if pairs else encode(model, validate.examples(data, need_target=True))
    fast = stair_effects(model, items, groups, pairs)
    if fast is not None:
        return fast
    return unit_effects(model, data, groups, abl, batch_size, corrupt=partner if abl == "corrupt" else None)


def _source(model: Model, data: list, ablation: str, partner: Any) -> list:
    """``data`` (zero), or its clean/corrupted Pairs (corrupted); refused before any work when unfit."""
    if ablation not in ABLATIONS:
        raise ValueError(f"ablation must be one of {ABLATIONS}, got {ablation!r}")
    if ablation == "zero":
        return data
    if partner is None:
        raise ValueError("ablation='corrupted' needs partner=, an example -> its corrupted example (partner_fn)")
    return make_pairs(model, data, corrupt=partner)  # refuses a partner of another token length


def _row(task: str, component: str, method: str, predicted, effect, ablation: str, seed: int) -> dict:
    return {
        "task": task,
        "component": component,
        "method": method,
        **stat_row(np.asarray(predicted), np.asarray(effect), seed),
        "n_units": len(effect),
        "ablation": ablation,
    }


def _pick_neurons(model: Model, scores: dict[str, NeuronScores], n_top: int, n_random: int, seed: int) -> list[int]:
    """Flat indices: each method's top ``n_top`` by |score| plus ``n_random`` random real neurons."""
    real = valid_neurons(model).flatten()  # padding neurons (past a dense layer's width) are no units
    pool = real.nonzero().flatten()
    gen = torch.Generator().manual_seed(int(seed))
    picked = set(pool[torch.randperm(pool.numel(), generator=gen)[:n_random]].tolist())
    for s in scores.values():
        key = s.scores.flatten().abs().masked_fill(~real, -torch.inf)
        picked |= set(torch.sort(key, descending=True).indices[: min(n_top, pool.numel())].tolist())
    return sorted(picked)


def agreement_table(
    model: Model,
    task: str,
    data: list,
    scores: dict[str, NeuronScores],
    *,
    n_top: int = 16,
    n_random: int = 16,
    ablation: str = "zero",
    partner: Any = None,
    seed: int = 0,
    batch_size: int = 16,
) -> pd.DataFrame:
    """Rows per (component, method) for one task; ``scores``: method -> NeuronScores on ``data``.

    Methods: ``scores``' and AtP (:func:`~capinterp.experiments.neuron_atp.neuron_atp`) against the same
    reference as the exact effects. ``ablation``: ``"zero"``, or ``"corrupted"`` with ``partner`` (an
    example -> its corrupted example of the same prompt token length, e.g.
    :func:`~capinterp.experiments.corrupt_partners.partner_fn`)."""
    L, d = neuron_shape(model)
    neurons = _pick_neurons(model, scores, n_top, n_random, seed)
    groups = [torch.zeros(L * d, dtype=torch.bool).index_fill_(0, torch.tensor([u]), True).view(L, d) for u in neurons]
    layer_groups = [torch.zeros(L, d, dtype=torch.bool).index_fill_(0, torch.tensor([l]), True) for l in range(L)]
    src = _source(model, data, ablation, partner)
    abl = "corrupt" if partner is not None and ablation == "corrupted" else "zero"
    effects = _effects(model, data, src, groups + layer_groups, abl, partner, batch_size)
    neuron_effect, layer_effect = effects[: len(groups)], effects[len(groups) :]
    atp = neuron_atp(model, src, batch_size=batch_size)
    methods = {**{m: s.scores for m, s in scores.items()}, "AtP": atp}
    rows = []
    for method, sc in methods.items():
        rows.append(
            _row(task, "FFN neuron", method, sc.flatten().double().numpy()[neurons], neuron_effect, ablation, seed)
        )
        rows.append(_row(task, "FFN layer", method, sc.double().sum(1).numpy(), layer_effect, ablation, seed))
    return pd.DataFrame(rows, columns=COLUMNS)


def head_table(
    model: Model,
    task: str,
    data: list,
    *,
    ablation: str = "zero",
    partner: Any = None,
    qk_fix: bool = True,
    graddrop: bool = True,
    relp: bool = True,
    batch_size: int = 16,
    seed: int = 0,
) -> pd.DataFrame:
    """Rows for component ``"attention head"``: AtP (and, with ``qk_fix``, AtP*'s attention-saturation
    fix where the model's graph has q/k slots) against exact single-head patching, every head (of the
    attention layers, on a hybrid model); with
    ``relp``, RelP (AtP with LRP rules in the backward pass, :mod:`capinterp.circuits.relp`); with
    ``graddrop``, AtP*'s GradDrop and ``|AtP|`` against ``|exact|`` (GradDrop is unsigned).
    ``ablation="corrupted"`` patches each head to its output on the example's corrupted prompt
    (``partner``, as :func:`agreement_table`), on both sides."""
    src = _source(model, data, ablation, partner)
    abl = "corrupt" if ablation == "corrupted" else "zero"
    kw: dict[str, Any] = {"ablation": abl, "batch_size": batch_size}
    exact = head_effects(model, src, **kw)
    has_heads = np.zeros(exact.shape, dtype=bool)  # a hybrid model's layers without attention: NaN rows
    has_heads[attention_layers(model)] = True
    heads = has_heads.ravel()
    exact = exact.ravel()[heads]
    atp = head_atp(model, src, **kw).ravel()[heads]
    methods = {"AtP": (atp, exact)}
    if relp:
        try:
            methods["RelP"] = (head_relp(model, src, **kw).ravel()[heads], exact)
        except UnsupportedFamily:
            if not family_of(model).hybrid_layers:
                raise
            # no RelP rule for a hybrid model's mixers: AtP and its corrections only
    if qk_fix:
        try:
            methods["AtP* (QK fix)"] = (head_atp_qk(model, src, **kw).ravel()[heads], exact)
        except NotImplementedError:
            pass  # no per-head q/k inputs on this family (granularity "layer"): AtP only
    if graddrop:
        gd = head_atp_graddrop(model, src, **kw).ravel()[heads]
        methods["|AtP| vs |effect|"] = (np.abs(atp), np.abs(exact))
        methods["AtP* (GradDrop) vs |effect|"] = (gd, np.abs(exact))
    rows = [_row(task, "attention head", m, sc, target, ablation, seed) for m, (sc, target) in methods.items()]
    return pd.DataFrame(rows, columns=COLUMNS)


def _figure(table: pd.DataFrame) -> go.Figure:
    fig = go.Figure()
    for method, g in table.groupby("method", sort=False):
        fig.add_bar(x=g["task"] + " / " + g["component"], y=g["pearson"], name=f"{method} (Pearson)")
    fig.update_layout(
        title="Attribution against exact activation patching (Pearson r)", yaxis_range=[-1, 1], template="plotly_white"
    )
    return fig


#: examples the QK fix's rows are measured on (it costs a forward per head and later layer, per batch)
QK_EXAMPLES = 16


def _qk_rows(ctx: Context, task: str, data: list) -> pd.DataFrame:
    """AtP and AtP*'s QK fix against exact zero patching of every head on ``data`` (a subset of the
    task: the fix's cost), methods named with the number of examples."""
    rows = head_table(ctx.model, task, data, relp=False, graddrop=False, seed=ctx.seed, batch_size=ctx.batch_size)
    rows["method"] = rows["method"] + f" ({len(data)} examples)"
    return rows


def _edge_part(ctx: Context, task: str, data: list, ig: dict[str, Any], n: int) -> pd.DataFrame:
    """The circuit-edge rows (:mod:`~capinterp.experiments.edge_agreement`), with the number of facts
    they used in column ``edge_facts`` (empty when too few facts have a subject swap)."""
    edges = edge_table(ctx.model, data, ig, n_top=n, n_random=n, seed=ctx.seed, batch_size=ctx.batch_size)
    if edges is None:
        return pd.DataFrame(columns=[*COLUMNS, "edge_facts"])
    rows = edge_rows(task, edges, lambda a, b: stat_row(a, b, ctx.seed))
    return rows.assign(edge_facts=edges[3])


def _variant_parts(
    ctx: Context,
    task: str,
    key: str,
    scores: dict[str, NeuronScores],
    ig: dict[str, Any],
    ablation: str,
    rows_data: list,
    partner: Any,
) -> list[pd.DataFrame]:
    """One task's rows for one reference (``ablation``): neurons and layers, heads, and (full variant,
    zero ablation) AtP*'s QK fix; each part cached in ``ctx.workdir``'s tables/, so an interrupted
    full run resumes after it."""
    out: list[pd.DataFrame] = []
    part = f"{key}_{ablation}_n{len(rows_data)}_s{ctx.seed}"
    n_pick = ctx.size(8, 32)
    out.append(
        ctx.table(
            f"{part}_units_top{n_pick}_kn{ig['rule']}{ig['steps']}",
            partial(
                agreement_table,
                ctx.model,
                task,
                rows_data,
                scores,
                n_top=n_pick,
                n_random=n_pick,
                ablation=ablation,
                partner=partner,
                seed=ctx.seed,
                batch_size=ctx.batch_size,
            ),
        )
    )
    # AtP*'s QK fix costs a forward per (head, later layer): full variant, zero ablation, the first
    # QK_EXAMPLES examples (_qk_rows); RelP / GradDrop a backward each (GradDrop one per layer): the
    # quick variant runs AtP only on the corrupted heads
    full = not ctx.quick or ablation == "zero"
    out.append(
        ctx.table(
            f"{part}_heads{'_relp_graddrop' if full else ''}",
            partial(
                head_table,
                ctx.model,
                task,
                rows_data,
                ablation=ablation,
                partner=partner,
                qk_fix=False,
                relp=full,
                graddrop=full,
                seed=ctx.seed,
                batch_size=ctx.batch_size,
            ),
        )
    )
    if not ctx.quick and ablation == "zero":
        qk_data = rows_data[:QK_EXAMPLES]
        out.append(ctx.table(f"{part}_qk{len(qk_data)}", partial(_qk_rows, ctx, task, qk_data)))
    return out


@experiment(NAME, TITLE)
def run(ctx: Context) -> ExperimentResult:
    """KN's IG, DCSN and AtP (neurons, layers) and AtP and its corrections (heads) against single-unit
    patching, zero and corrupted-prompt, on arithmetic (``sub``) and known facts.

    Quick: 4 subtraction problems, 4 builtin facts, 8 top + 8 random neurons per method. Full:
    faithfulness's sizes (128 held-out subtraction problems; up to 64 known facts from the builtin
    ones, ParaRel and ROME's known facts), 32 top + 32 random neurons per method; parts resume."""
    from capinterp.localizers.dcsn import DCSN
    from capinterp.localizers.kn import KN

    info: dict[str, Any] = {"edge_facts": 0, "corrupted_examples": {}}
    if ctx.quick:
        sub, facts = sub_and_facts(ctx, 4)
        problems, sub_pool = sub.locate[:4], sub.locate
    else:  # faithfulness's full sizes: its 128 held-out subtraction problems, up to 64 known facts
        sub = cd.prepared(ctx, {**cd.settings(ctx), "capabilities": ("sub",), "n_test": FULL_PROBLEMS})["sub"]
        problems, sub_pool = sub.test[:FULL_PROBLEMS], [*sub.locate, *sub.test]
        known, info["fact_sources"] = fact_bags(ctx, FULL_FACTS, 1)
        facts = [b[0] for b in known]
    # corrupted partners come from the whole task pool (all of sub's problems, all known facts)
    tasks = {"arithmetic (sub)": (problems, sub_pool)}
    if facts:
        tasks["facts"] = (facts, facts)
    info.update(n_problems=len(problems), n_facts=len(facts))
    ig = ctx.ig(4, 10)
    parts: list[pd.DataFrame] = []
    for task, (data, pool) in tasks.items():
        key = f"patch_{task.split()[0]}_n{len(data)}"

        def kn(data: list = data) -> NeuronScores:
            return KN(ctx.model, steps=ig["steps"], rule=ig["rule"], progress=False).fit(data).scores_

        def dcsn(data: list = data) -> NeuronScores:
            return DCSN(ctx.model, progress=False).fit(data).scores_

        scores = {
            "kn (IG)": ctx.scores(f"{key}_kn_{ig['rule']}{ig['steps']}", kn),
            "dcsn": ctx.scores(f"{key}_dcsn", dcsn),
        }
        found = partners(ctx.model, data, pool, seed=ctx.seed)
        paired = [e for e, p in zip(data, found) if p is not None]
        info["corrupted_examples"][task] = len(paired)
        variants = [("zero", data, None)]
        if len(paired) >= 2:  # examples without a partner of their token length are left out of these rows
            variants.append(("corrupted", paired, partner_fn(paired, [p for p in found if p is not None])))
        for ablation, rows_data, partner in variants:
            parts += _variant_parts(ctx, task, key, scores, ig, ablation, rows_data, partner)
        if task == "facts":  # edges need subject swaps (corrupted runs); none on arithmetic
            n = ctx.size(8, 32)
            edges = ctx.table(
                f"{key}_edges_top{n}_{ig['rule']}{ig['steps']}_s{ctx.seed}",
                partial(_edge_part, ctx, task, data, ig, n),
            )
            if len(edges):
                info["edge_facts"] = int(edges.pop("edge_facts").iloc[0])
                parts.append(edges)
    table = pd.concat(parts, ignore_index=True)
    info.update(
        notes=(
            "effect = drop of mean p(target) when the unit alone is patched at every position: ablation 'zero' "
            "sets it to 0; 'corrupted' to its value on another example of the task whose prompt has the same "
            "token count (the RelP / AtP* papers' clean -> corrupted patch; examples without one are left out, "
            "counts in corrupted_examples), every attribution taking the same reference (AtP: (a - ref) . dm/da); "
            "pearson_lo/hi, spearman_lo/hi: 95% percentile bootstrap over the units (1000 seeded resamples); "
            "neurons: each method's top by |score| plus random ones; layers: all of a layer's neurons against "
            "the sum of its scores; heads: every head's output zero-ablated alone against AtP "
            "((a - 0) . dm/da through the circuit graph), RelP (the same with LRP rules in the backward pass: "
            "LN-rule, identity rule on the MLP activation, half rule on a gated product, attention pattern held "
            "constant; Jafari et al. 2025), AtP* with the QK fix (later attention patterns "
            "recomputed with the head ablated in their q/k inputs; full run only, zero ablation, on the first "
            f"{QK_EXAMPLES} examples, methods named so) and AtP*'s GradDrop (mean over "
            "prompts of (1/(L-1)) sum over layers l of |AtP with no gradient through block l|, Kramar et al. 2024 "
            "eq. 11; unsigned, so it and |AtP| are correlated with |effect|); circuit edges (facts): EAP / EAP-IG scores "
            "against the exact change of logit[answer] - logit[swapped subject's answer] when one edge carries the "
            "subject-swapped run's value (each method's top edges by |score| plus random ones). RelP paper (GPT-2 small MLPs): attribution patching 0.195, RelP 0.992 "
            "(Pearson against activation patching)."
        ),
    )
    return ExperimentResult(NAME, TITLE, table, _figure(table), info)
