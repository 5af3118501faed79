"""How good is each localization? Faithfulness (MIB's CPR and CMD) of every localizer's ranking,
beside the same areas for random units of the same sizes (:mod:`capinterp.interventions.faithfulness`).

Two tasks: arithmetic (the ``sub`` capability: located on its locate split, measured on its
held-out test split) and facts (known builtin facts; located and measured on the same facts,
as a fact's neurons are fact-specific). Per task, each localizer that applies ranks its units:
CNL and DCSN (dataset-level neurons), KN / SIG / AMIG (IG per prompt, summed over the task's
prompts; AMIG's baseline is the mean activation over 32 texts of the local data folder, or over
the task's own prompts and answers without one), causal tracing (layers by their MLP indirect effect; facts only, it needs subjects).
Mean ablation over the task's data (first positions averaged apart from the rest: the attention
sink, :mod:`capinterp.core.position_mean`), p(target's first token) as the metric; sizes from 1 %
to 90 % of the units (MIB's grid stops at 50 %, see
:data:`~capinterp.interventions.faithfulness.DEFAULT_FRACTIONS`).

Knowledge circuits (facts only): EAP-IG edge scores over the same facts (``ctx.ig`` steps), edges
ranked by |score|, an edge's ablation its source's mean output in the downstream node's input
(:mod:`capinterp.interventions.edge_faithfulness`); the sizes are the same fractions, of all edges.

NeFT: neurons ranked by how far a short SGD fine-tune on the task's locate data turns their
weights (1 - cos; ``ctx.size(3, 20)`` steps). Query Localization (facts only): KN's per-query IG
over each fact's known paraphrases (``ctx.size(2, 4)`` per fact; facts with fewer than two are
left out), the consistency-aware scores (CAS, normalized per query) summed over the facts.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd
import plotly.graph_objects as go
import torch

from capinterp.core.example import Example, as_examples
from capinterp.data.capability_sources import shared_data_dir
from capinterp.data.corpus import local_texts
from capinterp.data.paraphrases import builtin_paraphrases, known_paraphrases
from capinterp.experiments import capability_data as cd
from capinterp.experiments.base import Context, ExperimentResult, experiment
from capinterp.interventions.faithfulness import DEFAULT_FRACTIONS, faithfulness
from capinterp.units.neurons import NeuronScores

__all__ = [
    "COLUMNS",
    "NOT_MEASURED",
    "QUICK_FRACTIONS",
    "cpr_figure",
    "faithfulness_table",
    "paraphrase_bags",
    "run",
    "sub_and_facts",
]

NAME, TITLE = "faithfulness", "How good is a localization? CPR / CMD of every localizer against chance"
QUICK_FRACTIONS = (0.01, 0.1, 0.25, 0.5, 0.75, 0.9)
NOT_MEASURED: dict[str, str] = {}  # method -> why its row has no numbers
COLUMNS = [
    "task",
    "method",
    "unit",
    "n_units",
    "cpr",
    "random_cpr_mean",
    "random_cpr_p05",
    "random_cpr_p95",
    "cmd",
    "random_cmd_mean",
    "random_cmd_p05",
    "random_cmd_p95",
    "full",
    "all_ablated",
    "n_examples",
    "note",
]


def _ranking(ctx: Context, method: str, task: str, locate: list, ig: dict[str, Any], bags: list) -> Any:
    """What ``method`` ranks on ``locate``: NeuronScores, per-layer scores for causal tracing, or a
    fitted KnowledgeCircuit (its edge scores); Query Localization ranks on the paraphrase ``bags``."""
    from capinterp import localizers
    from capinterp.localizers.query_localization import QueryLocalization

    if method in ("cnl", "dcsn"):
        params = {"steps": ig["steps"], "rule": ig["rule"]} if method == "cnl" else {}
        return ctx.localize(method, f"faith_{task}", locate, **params)
    cls: Any = None if method == "query_localization" else localizers.get(method)
    if method == "knowledge_circuit":  # EAP-IG edge scores over the facts, ranked by |score|
        return cls(ctx.model, algorithm="eap-ig", steps=ig["steps"], rule=ig["rule"], progress=False).fit(locate)
    if method == "causal_trace":
        return cls(ctx.model, samples=ctx.size(1, 3), progress=False).fit(locate).layer_scores_
    if method == "neft":
        steps = ctx.size(3, 20)
        fit = cls(ctx.model, steps=steps, batch_size=ctx.batch_size, progress=False).fit
        return ctx.scores(f"faith_neft_{task}_n{len(locate)}_s{steps}", lambda: fit(locate).scores_)
    if method == "query_localization":

        def cas() -> NeuronScores:
            ql = QueryLocalization(ctx.model, "kn", steps=ig["steps"], rule=ig["rule"], progress=False).fit(bags)
            total = torch.stack([ql.cas_scores(k).scores for k in range(len(bags))]).sum(0)
            return NeuronScores(total, meta={**ql.meta_, "score": "cas summed over facts", "n_facts": len(bags)})

        n = sum(len(b) for b in bags)
        return ctx.scores(f"faith_ql_cas_{task}_f{len(bags)}_n{n}_{ig['rule']}{ig['steps']}", cas)
    extra: dict[str, Any] = {}
    key = f"faith_{method}_{task}_n{len(locate)}_{ig['rule']}{ig['steps']}"
    if method == "amig":  # baseline: the local corpus's mean activation, or the task's own text without one
        corpus = shared_data_dir() is not None
        own = [e.prompt + e.target for e in as_examples(locate)]
        extra["baseline_texts"] = local_texts(n=32, seed=ctx.seed) if corpus else own
        key += "_corpus" if corpus else "_own"
    return ctx.scores(
        key, lambda: cls(ctx.model, steps=ig["steps"], rule=ig["rule"], progress=False, **extra).fit(locate).scores_
    )


def faithfulness_table(
    ctx: Context,
    tasks: Mapping[str, tuple[list, list, tuple[str, ...]]],
    paraphrases: Mapping[str, list[list[Example]]] | None = None,
) -> pd.DataFrame:
    """One row per (task, method): CPR / CMD and the random band; ``tasks``: name -> (locate
    examples, measure examples, methods); ``paraphrases``: task -> its facts' paraphrase bags
    (at least two queries each), which Query Localization locates on."""
    bags = dict(paraphrases or {})
    for task, (_, _, methods) in tasks.items():
        if "query_localization" in methods and task not in bags:
            raise ValueError(f"task {task!r}: query_localization needs the facts' paraphrase bags (paraphrases=)")
    ig = ctx.ig(3, 10)
    ks = QUICK_FRACTIONS if ctx.quick else DEFAULT_FRACTIONS
    rows: list[dict[str, Any]] = []
    for task, (locate, measure, methods) in tasks.items():
        for method in methods:
            if method in NOT_MEASURED:
                rows.append({"task": task, "method": method, "note": NOT_MEASURED[method]})
                continue
            if method == "query_localization" and not bags[task]:
                rows.append({"task": task, "method": method, "note": "no fact has two known paraphrases"})
                continue
            ranking = _ranking(ctx, method, task, locate, ig, bags.get(task, []))
            res = faithfulness(
                ctx.model,
                ranking,
                measure,
                ks=ks,
                random_sets=ctx.size(2, 20),
                seed=ctx.seed,
                batch_size=ctx.batch_size,
            )
            rows.append(
                {
                    "task": task,
                    "method": method,
                    "unit": res.meta["unit"],
                    "n_units": res.meta["n_units"],
                    "cpr": res.cpr,
                    "random_cpr_mean": res.random_cpr[0],
                    "random_cpr_p05": res.random_cpr[1],
                    "random_cpr_p95": res.random_cpr[2],
                    "cmd": res.cmd,
                    "random_cmd_mean": res.random_cmd[0],
                    "random_cmd_p05": res.random_cmd[1],
                    "random_cmd_p95": res.random_cmd[2],
                    "full": res.full,
                    "all_ablated": res.empty,
                    "n_examples": res.meta["n_examples"],
                    "note": f"CAS over {len(bags[task])} facts" if method == "query_localization" else "",
                }
            )
    return pd.DataFrame(rows, columns=COLUMNS)


def cpr_figure(table: pd.DataFrame) -> go.Figure:
    """CPR per (task, method), the random band (5th-95th percentile) as error bars around its mean."""
    t = table.dropna(subset=["cpr"])
    label = t["task"] + " / " + t["method"]
    fig = go.Figure()
    fig.add_bar(x=label, y=t["cpr"], name="CPR (located)")
    fig.add_scatter(
        x=label,
        y=t["random_cpr_mean"],
        mode="markers",
        name="random sets (5-95 %)",
        error_y={
            "type": "data",
            "symmetric": False,
            "array": t["random_cpr_p95"] - t["random_cpr_mean"],
            "arrayminus": t["random_cpr_mean"] - t["random_cpr_p05"],
        },
    )
    fig.update_layout(title="Faithfulness (CPR, higher is better) against random units", template="plotly_white")
    return fig


def sub_and_facts(ctx: Context, max_facts: int) -> tuple[cd.CapabilityData, list[Example]]:
    """The two tasks of the localization-quality experiments: the ``sub`` capability's data and
    up to ``max_facts`` builtin facts the model knows (none on a model that knows none)."""
    sub = cd.prepared(ctx, {**cd.settings(ctx), "capabilities": ("sub",)})["sub"]
    bags = known_paraphrases(
        ctx.model, builtin_paraphrases(), per_fact=1, min_prompts=1, max_facts=max_facts, allow_empty=True
    )
    return sub, [bag[0] for bag in bags]


def paraphrase_bags(ctx: Context, facts: list[Example], per_fact: int) -> list[list[Example]]:
    """Per fact (in order), up to ``per_fact`` builtin paraphrases the model answers; facts with
    fewer than two are left out. A fact's first known paraphrase is the fact's own prompt."""
    builtin = {bag[0].meta["fact_id"]: bag for bag in builtin_paraphrases()}
    mine = [builtin[f.meta["fact_id"]] for f in facts]
    return known_paraphrases(ctx.model, mine, per_fact=per_fact, min_prompts=2, allow_empty=True)


@experiment(NAME, TITLE)
def run(ctx: Context) -> ExperimentResult:
    """Arithmetic (``sub``) and known facts; every localizer's CPR / CMD beside chance."""
    sub, facts = sub_and_facts(ctx, ctx.size(4, 16))
    arithmetic: tuple[str, ...]
    on_facts: tuple[str, ...]
    if ctx.quick:  # one ranking per kind: dataset IG, projection, fine-tune, per-prompt IG, CAS, layers, edges
        arithmetic = ("cnl", "dcsn", "neft")
        on_facts = ("kn", "query_localization", "causal_trace", "knowledge_circuit")
    else:
        arithmetic = ("cnl", "dcsn", "kn", "sig", "amig", "neft")
        on_facts = ("cnl", "dcsn", "kn", "sig", "amig", "neft", "query_localization", "causal_trace")
        on_facts += ("knowledge_circuit",)
    tasks: dict[str, tuple[list, list, tuple[str, ...]]] = {
        "arithmetic (sub)": (sub.locate, sub.test[: ctx.size(6, 32)], arithmetic)
    }
    bags: dict[str, list[list[Example]]] = {}
    if facts:
        tasks["facts"] = (facts, facts, on_facts)
        bags["facts"] = paraphrase_bags(ctx, facts, ctx.size(2, 4))
    table = faithfulness_table(ctx, tasks, bags)
    info = {
        "n_facts": len(facts),
        "ks": list(QUICK_FRACTIONS if ctx.quick else DEFAULT_FRACTIONS),
        "notes": (
            "CPR = area under the faithfulness curve (top-k kept, the rest mean-ablated), CMD = area between it "
            "and 1, over the share of units kept (MIB, Mueller et al. 2025; sizes up to 90 %, MIB's stop at 50 %); "
            "the rest mean-ablated, first positions averaged apart (the attention sink); random_* = the same areas for "
            "uniformly random units of each size. MIB's CPR for EAP-IG-inputs on IOI: 1.85 / 1.63 / 3.20 / 2.08 "
            "(GPT-2 / Qwen-2.5 / Gemma-2 / Llama-3.1), on edges as the knowledge_circuit row, but a different task "
            "and graph."
        ),
    }
    return ExperimentResult(NAME, TITLE, table, cpr_figure(table), info)
