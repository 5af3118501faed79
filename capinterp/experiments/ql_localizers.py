"""Inconsistent facts per knowledge-neuron localizer (Chen et al. 2025, arXiv 2405.14117, Sec. 3 and Table 1).

Chen et al. test the Knowledge Localization assumption with three localizers, IG (KN), SIG and
AMIG: a fact is inconsistent (K_II) when the knowledge-neuron sets of its paraphrased queries
barely overlap (consistency score CS below tau), and they report the K_II share per localizer and
"intersection: II", the share of facts that all three call inconsistent. Here: builtin paraphrase
bags the model answers, one :class:`capinterp.QueryLocalization` per localizer (``"kn"``,
``"sig"``, ``"amig"``) with the same facts, tau = 0.3 (static) and Otsu.
"""

from __future__ import annotations

import time
from typing import Any

import pandas as pd
import plotly.graph_objects as go

from capinterp.data.capability_sources import shared_data_dir
from capinterp.data.corpus import local_texts
from capinterp.data.paraphrases import builtin_paraphrases, known_paraphrases
from capinterp.experiments.base import Context, ExperimentResult, experiment
from capinterp.localizers.query_localization import QueryLocalization

__all__ = ["LOCALIZERS", "PAPER", "inconsistency_table", "run"]

LOCALIZERS = ("kn", "sig", "amig")
# K_II share (%) per model, Chen et al. 2025, Table 1 (the intersection is reported for LLaMA3-8b only)
PAPER = {"GPT-2": 50.4, "LLaMA2-7b": 66.7, "LLaMA3-8b": 80.9, "intersection II (LLaMA3-8b)": 77.0}


def inconsistency_table(fits: dict[str, QueryLocalization]) -> pd.DataFrame:
    """One row per localizer (K_II shares, mean CS2) and one ``"intersection: II"`` row."""
    rows, static, otsu = [], [], []
    for name, ql in fits.items():
        s = ql.summary()
        rows.append(
            {
                "localizer": name,
                "n_facts": int(s["n_facts"]),
                "share_inconsistent_static": float(s["share_inconsistent_static"]),
                "share_inconsistent_otsu": float(s["share_inconsistent_otsu"]),
                "mean_cs2": float(s["mean_cs2"]),
                "mean_query_neurons": float(s["mean_query_neurons"]),
            }
        )
        static.append(~ql.consistency_["consistent_static"].to_numpy(bool))
        otsu.append(~ql.consistency_["consistent_otsu"].to_numpy(bool))
    if fits:
        all_static = static[0].copy()
        all_otsu = otsu[0].copy()
        for a, b in zip(static[1:], otsu[1:]):
            all_static &= a
            all_otsu &= b
        rows.append(
            {
                "localizer": "intersection: II",
                "n_facts": len(all_static),
                "share_inconsistent_static": float(all_static.mean()),
                "share_inconsistent_otsu": float(all_otsu.mean()),
                "mean_cs2": float("nan"),
                "mean_query_neurons": float("nan"),
            }
        )
    return pd.DataFrame(rows)


TITLE = "Inconsistent facts per knowledge-neuron localizer (Chen et al. 2025)"


@experiment("ql_localizers", TITLE)
def run(ctx: Context) -> ExperimentResult:
    """Builtin paraphrase bags the model answers; QueryLocalization with each localizer.

    Quick mode: 2 facts x 2 queries, 2 steps; full mode: up to 12 facts x 4 queries, 10 steps
    (their times on Gemma 3: docs/results.md, "Inconsistent facts per localizer").
    """
    bags = known_paraphrases(
        ctx.model, builtin_paraphrases(ctx.size(3, None)), per_fact=ctx.size(2, 4), max_facts=ctx.size(2, 12)
    )
    ig = ctx.ig(2, 10)  # the papers' right sum, or Gauss-Legendre with --ig-rule accurate
    texts = (
        local_texts(n=32, seed=ctx.seed)
        if shared_data_dir() is not None
        else [e.prompt + e.target for bag in bags for e in bag]
    )  # no local corpus: the facts' own text
    extra: dict[str, dict[str, Any]] = {"amig": {"baseline_texts": texts}}
    fits, seconds = {}, {}
    for name in LOCALIZERS:
        t0 = time.perf_counter()
        ql = QueryLocalization(ctx.model, localizer=name, **ig, progress=ctx.progress, **extra.get(name, {}))
        fits[name] = ql.fit(bags)
        seconds[name] = round(time.perf_counter() - t0, 1)
    table = inconsistency_table(fits)
    fig = go.Figure(
        [
            go.Bar(x=table["localizer"], y=100 * table["share_inconsistent_static"], name="tau = 0.3"),
            go.Bar(x=table["localizer"], y=100 * table["share_inconsistent_otsu"], name="Otsu"),
        ]
    )
    fig.update_layout(barmode="group", title="Share of inconsistent facts (K_II) per localizer", yaxis_title="%")
    info = {
        "paper": PAPER,
        "fit_seconds": seconds,
        "steps": ig["steps"],
        "ig_rule": ig["rule"],
        "n_facts": len(bags),
        "queries_per_fact": ctx.size(2, 4),
        "notes": "AMIG's baseline: mean activation over 32 texts of the local data folder (or the facts' own text without one).",
    }
    return ExperimentResult("ql_localizers", TITLE, table, fig, info)
