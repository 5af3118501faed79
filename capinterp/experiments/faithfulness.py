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

Every row carries sufficiency (CPR, CMD: the top-k kept) and necessity (the ablated area: the
top-k removed), each with a 95 % bootstrap interval over the examples and the random band of its
task and unit kind (run once, shared by the methods). Full variant: up to 64 known facts
(:func:`fact_bags`; ``info`` says how many were found and from where), 128 subtraction problems,
20 random draws per size; each row is cached in the run folder, so an interrupted run resumes.
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
    "QUICK_LOCATE",
    "QUICK_PROBLEMS",
    "cpr_figure",
    "fact_bags",
    "faithfulness_table",
    "paraphrase_bags",
    "run",
    "sub_and_facts",
]

NAME, TITLE = "faithfulness", "How good is a localization? CPR / CMD of every localizer against chance"
#: The quick variant's sizes (CI time: every size is a kept and an ablated run per draw).
QUICK_FRACTIONS = (0.1, 0.5, 0.9)
#: The quick variant's subtraction problems to locate on (of the capability's 12) and to measure.
QUICK_LOCATE, QUICK_PROBLEMS = 6, 6
NOT_MEASURED: dict[str, str] = {}  # method -> why its row has no numbers
COLUMNS = [
    "task",
    "method",
    "unit",
    "n_units",
    "cpr",
    "cpr_lo",
    "cpr_hi",
    "random_cpr_mean",
    "random_cpr_p05",
    "random_cpr_p95",
    "cmd",
    "cmd_lo",
    "cmd_hi",
    "random_cmd_mean",
    "random_cmd_p05",
    "random_cmd_p95",
    "ablated_area",
    "ablated_area_lo",
    "ablated_area_hi",
    "random_ablated_area_mean",
    "random_ablated_area_p05",
    "random_ablated_area_p95",
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
    """One row per (task, method): CPR / CMD / ablated area with bootstrap intervals and the random
    band; ``tasks``: name -> (locate examples, measure examples, methods); ``paraphrases``: task ->
    its facts' paraphrase bags (at least two queries each), which Query Localization locates on.
    The random band is run once per (task, unit kind) and shared by its methods; each row is cached
    in ``ctx.workdir`` (``tables/``), so an interrupted run resumes after its last finished row."""
    bags = dict(paraphrases or {})
    for task, (_, _, methods) in tasks.items():
        if "query_localization" in methods and task not in bags:
            raise ValueError(f"task {task!r}: query_localization needs the facts' paraphrase bags (paraphrases=)")
    ig = ctx.ig(3, 10)
    ks = QUICK_FRACTIONS if ctx.quick else DEFAULT_FRACTIONS
    settings: dict[str, Any] = {"ks": ks, "random_sets": ctx.size(2, 20)}
    settings.update(seed=ctx.seed, batch_size=ctx.batch_size, bootstrap=BOOTSTRAP)
    shared: dict[tuple[str, str], Any] = {}  # (task, unit kind) -> the random band its methods share
    rows: list[pd.DataFrame] = []
    for task, (locate, measure, methods) in tasks.items():
        for method in methods:
            if method in NOT_MEASURED:
                rows.append(_row({"task": task, "method": method, "note": NOT_MEASURED[method]}))
                continue
            if method == "query_localization" and not bags[task]:
                rows.append(_row({"task": task, "method": method, "note": "no fact has two known paraphrases"}))
                continue

            def measured(task=task, method=method, locate=locate, measure=measure) -> pd.DataFrame:
                ranking = _ranking(ctx, method, task, locate, ig, bags.get(task, []))
                kind = _KIND.get(method, "neuron")
                band = shared.get((task, kind))
                # the band (a full run's longest part) is saved chunk by chunk: an interruption loses little
                ckpt = None if band is not None or kind == "edge" else ctx.checkpoint(f"band_{_slug(task)}_{kind}")
                res = faithfulness(ctx.model, ranking, measure, band=band, checkpoint=ckpt, **settings)
                if kind != "edge":  # an edge band belongs to its own fitted graph
                    shared[(task, kind)] = res.band
                note = f"CAS over {len(bags[task])} facts" if method == "query_localization" else ""
                return _row(_numbers(task, method, res, note))

            n_bags = sum(len(b) for b in bags.get(task, []))
            key = (
                f"faith_row_v2_{_slug(task)}_{method}_n{len(locate)}-{len(measure)}-{n_bags}_{ig['rule']}{ig['steps']}"
            )
            rows.append(ctx.table(f"{key}_r{settings['random_sets']}_k{len(ks)}_s{ctx.seed}", measured))
    return pd.concat(rows, ignore_index=True)[COLUMNS] if rows else pd.DataFrame(columns=COLUMNS)


#: Bootstrap resamples (of the examples) behind every interval.
BOOTSTRAP = 1000
_KIND = {"causal_trace": "layer", "knowledge_circuit": "edge"}


def _slug(task: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in task).strip("-")


def _row(values: dict[str, Any]) -> pd.DataFrame:
    return pd.DataFrame([values], columns=COLUMNS)


def _numbers(task: str, method: str, res: Any, note: str) -> dict[str, Any]:
    """One table row: the areas with their intervals, the random bands, the end points."""
    row: dict[str, Any] = {"task": task, "method": method, "unit": res.meta["unit"], "n_units": res.meta["n_units"]}
    for name in ("cpr", "cmd", "ablated_area"):
        lo_hi, band = getattr(res, f"{name}_ci"), getattr(res, f"random_{name}")
        row.update({name: getattr(res, name), f"{name}_lo": lo_hi[0], f"{name}_hi": lo_hi[1]})
        row.update({f"random_{name}_mean": band[0], f"random_{name}_p05": band[1], f"random_{name}_p95": band[2]})
    row.update({"full": res.full, "all_ablated": res.empty, "n_examples": res.meta["n_examples"], "note": note})
    return row


def cpr_figure(table: pd.DataFrame) -> go.Figure:
    """CPR (sufficiency) and the ablated area (necessity) per (task, method) with their bootstrap
    intervals, each beside the random band (5th-95th percentile) around its mean."""
    t = table.dropna(subset=["cpr"])
    label = t["task"] + " / " + t["method"]
    fig = go.Figure()
    for name, title in (("cpr", "CPR (top-k kept)"), ("ablated_area", "ablated area (top-k removed)")):
        own = {
            "type": "data",
            "symmetric": False,
            "array": t[f"{name}_hi"] - t[name],
            "arrayminus": t[name] - t[f"{name}_lo"],
        }
        fig.add_bar(x=label, y=t[name], name=title, error_y=own)
        mean, lo, hi = (t[f"random_{name}_{s}"] for s in ("mean", "p05", "p95"))
        rand = {"type": "data", "symmetric": False, "array": hi - mean, "arrayminus": mean - lo}
        fig.add_scatter(x=label, y=mean, mode="markers", name=f"random sets, {name} (5-95 %)", error_y=rand)
    fig.update_layout(
        title="Faithfulness against random units: CPR (sufficiency) and ablated area (necessity), higher is better",
        template="plotly_white",
    )
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


def fact_bags(ctx: Context, max_facts: int, per_fact: int) -> tuple[list[list[Example]], dict[str, int]]:
    """Up to ``max_facts`` facts the model knows, each as its known paraphrases (at most ``per_fact``;
    the first is the fact): the builtin paraphrase facts, then, where the data folder
    (``CAPINTERP_DATA``) has them, the knowledge-neurons ParaRel bags and ROME's known facts (one
    prompt each). Filtered in chunks, so the search stops once enough are known; also returns how
    many facts each source gave."""
    from capinterp.data.capability_sources import data_file
    from capinterp.data.facts import load_known_facts
    from capinterp.data.paraphrases import pararel_paraphrases

    sources: list[tuple[str, Any]] = [("builtin", builtin_paraphrases)]
    if data_file("knowledge_neurons/data_11.json") is not None:
        sources.append(("pararel", lambda: pararel_paraphrases(4 * max_facts, per_fact=per_fact)))
    known_file = data_file("rome_knowns/known_1000.json")
    if known_file is not None:
        sources.append(("known_1000", lambda: [[e] for e in load_known_facts(known_file, limit=8 * max_facts)]))
    out: list[list[Example]] = []
    seen: set[str] = set()
    counts: dict[str, int] = {}
    for name, load in sources:
        counts[name] = 0
        fresh = [b for b in load() if b and b[0].prompt not in seen]
        for start in range(0, len(fresh), 64):
            if len(out) >= max_facts:
                break
            chunk = fresh[start : start + 64]
            got = known_paraphrases(
                ctx.model, chunk, per_fact=per_fact, min_prompts=1, max_facts=max_facts - len(out), allow_empty=True
            )
            got = [b for b in got if b[0].prompt not in seen]
            seen.update(b[0].prompt for b in got)
            out += got
            counts[name] += len(got)
    return out, counts


@experiment(NAME, TITLE)
def run(ctx: Context) -> ExperimentResult:
    """Arithmetic (``sub``) and known facts; every localizer's CPR / CMD / ablated area beside chance.

    Quick: 4 builtin facts, 6 subtraction problems (located on 6 others), 3 sizes, 2 random draws
    per size, one ranking per kind of localizer. Full: up to 64 known facts (builtin, ParaRel, ROME's known facts), 128
    subtraction problems, 20 random draws per size, every localizer; rows resume from ``ctx.workdir``."""
    info: dict[str, Any] = {}
    if ctx.quick:  # one ranking per kind: dataset IG, projection, fine-tune, per-prompt IG, CAS, layers, edges
        sub, facts = sub_and_facts(ctx, 4)
        locate, measure = sub.locate[:QUICK_LOCATE], sub.test[:QUICK_PROBLEMS]
        bags = paraphrase_bags(ctx, facts, 2) if facts else []
        arithmetic: tuple[str, ...] = ("cnl", "dcsn", "neft")
        on_facts: tuple[str, ...] = ("kn", "query_localization", "causal_trace", "knowledge_circuit")
    else:
        sub = cd.prepared(ctx, {**cd.settings(ctx), "capabilities": ("sub",), "n_test": FULL_PROBLEMS})["sub"]
        locate, measure = sub.locate, sub.test[:FULL_PROBLEMS]
        known, info["fact_sources"] = fact_bags(ctx, FULL_FACTS, 4)
        facts, bags = [b[0] for b in known], [b for b in known if len(b) >= 2]
        # cheapest first, so an interrupted run has the most rows: SIG integrates each prompt token in
        # turn (its fit costs ~T times KN's) and the edges' random band runs on the circuit graph
        arithmetic = ("cnl", "dcsn", "kn", "amig", "neft", "sig")
        on_facts = ("cnl", "dcsn", "kn", "amig", "neft", "query_localization", "causal_trace")
        on_facts += ("knowledge_circuit", "sig")
        if len(facts) < MIN_FACTS:
            info["warning"] = f"the model knows only {len(facts)} of the facts searched (fewer than {MIN_FACTS})"
    tasks: dict[str, tuple[list, list, tuple[str, ...]]] = {"arithmetic (sub)": (locate, measure, arithmetic)}
    if facts:
        tasks["facts"] = (facts, facts, on_facts)
    table = faithfulness_table(ctx, tasks, {"facts": bags} if facts else {})
    info.update({"n_facts": len(facts), "n_problems": len(measure), "random_sets": ctx.size(2, 20)})
    info.update({"ks": list(QUICK_FRACTIONS if ctx.quick else DEFAULT_FRACTIONS), "bootstrap": BOOTSTRAP})
    info["notes"] = NOTES
    return ExperimentResult(NAME, TITLE, table, cpr_figure(table), info)


#: Full-variant sizes: facts searched for, subtraction problems measured, the fewest facts that support a reading.
FULL_FACTS, FULL_PROBLEMS, MIN_FACTS = 64, 128, 50
NOTES = (
    "CPR = area under the faithfulness curve (top-k kept, the rest mean-ablated), CMD = area between it "
    "and 1, over the share of units kept (MIB, Mueller et al. 2025; sizes up to 90 %, MIB's stop at 50 %); "
    "ablated_area = the share of the behaviour lost with only the top-k mean-ablated, averaged over the same "
    "sizes (necessity; higher = more necessary); *_lo / *_hi: 95 % percentile bootstrap intervals over the "
    "examples (1000 resamples); the rest mean-ablated, first positions averaged apart (the attention sink); "
    "random_* = the same areas for uniformly random units of each size (mean, 5th and 95th percentile over the "
    "draws; one band per task and unit kind, shared by its methods). MIB's CPR for EAP-IG-inputs on IOI: "
    "1.85 / 1.63 / 3.20 / 2.08 (GPT-2 / Qwen-2.5 / Gemma-2 / Llama-3.1), on edges as the knowledge_circuit "
    "row, but a different task and graph."
)
