"""Fidelity of individual-knowledge localization (Huang et al. 2025, Sec. 3.1).

A faithful localizer should find the same units for paraphrases of one fact. For every fact the
model answers (builtin paraphrase bags, :mod:`capinterp.data.paraphrases`), each paraphrase is
localized on its own by

* **KN** -- the prompt's coarse knowledge-neuron set (IG at the last prompt token, > 0.2 max);
* **ROME** -- causal tracing, the top-3 MLP layers at the last subject token (noise 3 x the std of
  the prompt's own subject embeddings, as Know-MRI traces one prompt at a time);
* **KC** -- a knowledge circuit, the top-``kc_top_n`` edges by EAP (one gradient; the corrupted run
  is the noised subject because a single prompt has no other subject to swap in), dead nodes pruned;

and the overlap coefficient |A ∩ B| / min(|A|, |B|) is averaged over the paraphrase pairs.
Paper (GPT-J, 5 GPT-4o rewrites, Table 4): KN 37.3 %, ROME 32.7 %, KC 7.2 % (for KC the paper's
text counts pairs with identical circuits; ``identical_pairs`` reports that share).
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from capinterp.core.example import Example
from capinterp.core.protocol import Model
from capinterp.data.paraphrases import builtin_paraphrases, known_paraphrases
from capinterp.experiments._per_sample import ScoreCache, kn_neurons, kn_scores
from capinterp.experiments.base import Context, ExperimentResult, experiment
from capinterp.plots.paper import measured_vs_paper
from capinterp.units import metrics
from capinterp.units.base import UnitSet

__all__ = ["METHODS", "PAPER_OVERLAP", "fidelity_table", "locate_paraphrases", "run", "summarize"]

METHODS: tuple[str, ...] = ("kn", "rome", "kc")
PAPER_OVERLAP = {"kn": 37.3, "rome": 32.7, "kc": 7.2}  # % (Huang et al. 2025, Table 4, GPT-J)
COLUMNS = [
    "method",
    "fact",
    "subject",
    "n_paraphrases",
    "mean_overlap",
    "mean_overlap_chance",
    "mean_iou",
    "mean_iou_chance",
    "identical_pairs",
    "mean_units",
    "unit",
]


def locate_paraphrases(
    model: Model,
    bag: Sequence[Example],
    method: str,
    *,
    kn_steps: int = 20,
    kn_rule: str = "right",
    kn_threshold: float = 0.2,
    ct_samples: int = 10,
    ct_top_k: int = 3,
    kc_top_n: int = 100,
    cache: ScoreCache | None = None,
) -> list[UnitSet | None]:
    """One located unit set per paraphrase (None where causal tracing skips the prompt)."""
    if method == "kn":
        return [kn_neurons(kn_scores(model, ex, steps=kn_steps, rule=kn_rule, cache=cache), kn_threshold) for ex in bag]
    if method == "rome":
        from capinterp.localizers.causal_trace import CausalTrace

        out: list[UnitSet | None] = []
        for ex in bag:
            ct = CausalTrace(model, samples=ct_samples, kinds=("mlp",), top_k=ct_top_k, progress=False).fit([ex])
            out.append(ct.units_ if ct.n_traced_ else None)
        return out
    if method == "kc":
        from capinterp.localizers.knowledge_circuit import KnowledgeCircuit

        return [KnowledgeCircuit(model, algorithm="eap", top_n=kc_top_n, progress=False).fit([ex]).units_ for ex in bag]
    raise ValueError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")


def _pair_stats(sets: list[UnitSet]) -> dict[str, float]:
    pairs = list(itertools.combinations(sets, 2))
    if not pairs:
        return dict.fromkeys(
            ("mean_overlap", "mean_overlap_chance", "mean_iou", "mean_iou_chance", "identical_pairs"), np.nan
        )
    chance = [metrics.chance_stats(a, b) for a, b in pairs]
    return {
        "mean_overlap": float(np.mean([metrics.overlap(a, b) for a, b in pairs])),
        "mean_overlap_chance": float(np.mean([c["overlap_chance"] for c in chance])),
        "mean_iou": float(np.mean([metrics.iou(a, b) for a, b in pairs])),
        "mean_iou_chance": float(np.mean([c["iou_chance"] for c in chance])),
        "identical_pairs": float(np.mean([a.keys() == b.keys() for a, b in pairs])),
    }


def fidelity_table(
    model: Model,
    bags: Sequence[Sequence[Example]],
    *,
    methods: Sequence[str] = METHODS,
    cache: ScoreCache | None = None,
    progress: Callable[[str], None] | None = None,
    **params: Any,
) -> pd.DataFrame:
    """One row per (method, fact): mean pairwise overlap / IoU of the paraphrases' unit sets.

    ``bags``: one list of paraphrased Examples per fact (targets set, ``meta["subject"]`` for ROME).
    ``params`` go to :func:`locate_paraphrases` (kn_steps, ct_samples, kc_top_n, ...). Overlaps
    are fractions in [0, 1]; ``mean_units`` is the mean set size (neurons, layers or edges).
    """
    rows = []
    for method in methods:
        if method not in METHODS:
            raise ValueError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
        for i, bag in enumerate(bags):
            if progress:
                progress(f"fidelity {method} fact {i + 1}/{len(bags)}")
            sets = [s for s in locate_paraphrases(model, bag, method, cache=cache, **params) if s is not None]
            rows.append(
                {
                    "method": method,
                    "fact": bag[0].meta.get("fact_id", i),
                    "subject": bag[0].meta.get("subject"),
                    "n_paraphrases": len(sets),
                    **_pair_stats(sets),
                    "mean_units": float(np.mean([len(s) for s in sets])) if sets else np.nan,
                    "unit": sets[0].kind if sets else None,
                }
            )
    return pd.DataFrame(rows, columns=COLUMNS)


def summarize(table: pd.DataFrame) -> pd.DataFrame:
    """Per method: mean over facts of the overlap / IoU / identical share (in %), the chance levels
    of overlap and IoU for random sets of the same sizes, a 95 % bootstrap interval of the mean
    overlap over facts, and the paper's overlap."""
    g = table.groupby("method", sort=False)
    cols = ["mean_overlap", "mean_overlap_chance", "mean_iou", "mean_iou_chance", "identical_pairs"]
    out = g[cols].mean().mul(100).round(1)
    ci = {m: metrics.bootstrap_ci(v.to_numpy()) for m, v in g["mean_overlap"]}
    out["overlap_ci_low"] = [round(100 * ci[m][0], 1) for m in out.index]
    out["overlap_ci_high"] = [round(100 * ci[m][1], 1) for m in out.index]
    out["mean_units"] = g["mean_units"].mean().round(1)
    out["n_facts"] = g.size()
    out["paper_overlap"] = [PAPER_OVERLAP.get(m, np.nan) for m in out.index]
    return out.reset_index()


def _figure(summary: pd.DataFrame) -> go.Figure:
    return measured_vs_paper(
        summary["method"],
        summary["mean_overlap"],
        summary["paper_overlap"],
        title="Fidelity: overlap of units located on paraphrases of one fact",
        yaxis_title="mean pairwise overlap (%)",
        xaxis_title="localizer",
    )


@experiment("fidelity", "Fidelity: do paraphrases of one fact get the same units? (Huang et al. 2025, Sec. 3.1)")
def run(ctx: Context) -> ExperimentResult:
    """Builtin paraphrase bags the model answers; KN, ROME top-3 layers, KC EAP edges; pairwise overlap."""
    per_fact = ctx.size(3, 4)
    candidates = builtin_paraphrases(3 if ctx.quick else None)
    bags = known_paraphrases(ctx.model, candidates, per_fact=per_fact, max_facts=ctx.size(1, 4))
    ig = ctx.ig(3, 10)
    params = dict(kn_steps=ig["steps"], kn_rule=ig["rule"], ct_samples=ctx.size(1, 3), kc_top_n=100)
    progress = (lambda msg: print(msg, file=sys.stderr, flush=True)) if ctx.progress else None
    table = fidelity_table(ctx.model, bags, cache=ctx.scores, progress=progress, **params)
    summary = summarize(table)
    info = {
        "paper_overlap_percent": PAPER_OVERLAP,
        "measured_overlap_percent": dict(zip(summary["method"], summary["mean_overlap"])),
        "summary": summary.to_dict("records"),
        "n_facts": len(bags),
        "paraphrases_per_fact": per_fact,
        **params,
        "notes": (
            "Builtin paraphrases (written for capinterp), prompts the model answers only. KN: per-prompt "
            "coarse set; ROME: top-3 MLP layers at the last subject token; KC: top-100 EAP edges. "
            "Overlap = |A∩B|/min(|A|,|B|), mean over paraphrase pairs, then over facts. The paper used "
            "GPT-J with 5 GPT-4o rewrites and KN IG with 20 steps."
        ),
    }
    return ExperimentResult("fidelity", "Fidelity of individual-knowledge localization", table, _figure(summary), info)
