"""Reliability of parameter layers: ROME edits at every layer (Huang et al. 2025, Sec. 3.2, Fig. 2).

ROME (Meng et al. 2022) locates a fact in the MLP layers causal tracing marks and validates the
location by editing there. Huang et al. ("Capability Localization", arXiv 2502.20992, Fig. 2) edit the same CounterFact facts at
every layer of GPT-J and find that layers causal tracing does *not* mark edit about as well, so a
successful edit does not confirm the location. Here: CounterFact facts the model knows (it
prefers the true object to the new one on the rewrite prompt), each edited alone with
:func:`capinterp.rome_edit` at each layer (model restored between edits), scored with ROME's
efficacy / paraphrase / neighbourhood scores (:mod:`capinterp.interventions.rome_eval`); the
top-3 MLP layers of causal tracing (:class:`capinterp.CausalTrace`, last subject token, averaged
over the same facts) are marked. ``info["traced_minus_other"]`` compares the two groups.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from capinterp.core.example import Example
from capinterp.core.protocol import Model
from capinterp.data.capability_sources import data_file
from capinterp.data.corpus import local_texts
from capinterp.data.facts import load_counterfact
from capinterp.experiments.base import Context, ExperimentResult, experiment
from capinterp.interventions.rome_eval import SCORES, counterfact_scores, rome_counterfact, summarize
from capinterp.localizers.causal_trace import CausalTrace

__all__ = [
    "edit_regression",
    "known_counterfact",
    "layer_frame",
    "layer_summary",
    "r_squared",
    "run",
    "tracing_effects",
]

COUNTERFACT = "counterfact/counterfact-edit.json"
# a fallback when the shared CounterFact file is absent (same layout as load_counterfact's)
BUILTIN = [
    Example(
        "The Eiffel Tower is located in the city of",
        " Paris",
        {
            "subject": "Eiffel Tower",
            "ground_truth": " Paris",
            "target_new": " Rome",
            "case_id": -1,
            "paraphrases": ["The Eiffel Tower stands in the city of"],
            "locality": [{"prompt": "The Louvre is located in the city of", "target": " Paris"}],
        },
    ),
    Example(
        "The capital of Japan is",
        " Tokyo",
        {
            "subject": "Japan",
            "ground_truth": " Tokyo",
            "target_new": " London",
            "case_id": -2,
            "paraphrases": ["Japan's capital city is"],
            "locality": [{"prompt": "The largest city in Japan is", "target": " Tokyo"}],
        },
    ),
]


def known_counterfact(model: Model, n: int, pool: int = 60) -> list[Example]:
    """Up to ``n`` CounterFact facts (first ``pool`` records) on which ``model`` prefers the true object."""
    path = data_file(COUNTERFACT)
    facts = load_counterfact(path, limit=pool) if path is not None else BUILTIN
    known: list[Example] = []
    for f in facts:
        if len(known) == n:
            break
        if summarize(counterfact_scores(model, [f]))["efficacy"] == 0.0:
            known.append(f)
    if not known:
        raise ValueError(f"the model prefers the true object on none of the first {pool} CounterFact facts")
    return known


def layer_frame(
    model: Model, facts: Sequence[Example], layers: Sequence[int], ctx: Context | None = None, **rome_params: Any
) -> pd.DataFrame:
    """One row per (fact, layer): ROME's three scores before and after the edit at that layer.

    With ``ctx``, each layer's rows are cached in its workdir (:meth:`Context.table`), so an
    interrupted run resumes at the next layer."""
    settings = "_".join(f"{k}{v}" for k, v in sorted(rome_params.items()) if k != "texts")
    cases = "-".join(str(f.meta.get("case_id", i)) for i, f in enumerate(facts))
    n_texts = len(rome_params.get("texts") or ())

    def one(layer: int) -> pd.DataFrame:
        make = lambda: rome_counterfact(model, facts, layer, **rome_params)  # noqa: E731
        if ctx is None:
            return make()
        frame = ctx.table(f"rome_L{layer}_{cases}_{settings}_t{n_texts}", make)
        if ctx.progress:
            print(f"rome_layers: layer {layer} done", file=sys.stderr, flush=True)
        return frame

    return pd.concat([one(layer) for layer in layers], ignore_index=True)


def layer_summary(frame: pd.DataFrame, traced: Sequence[int]) -> pd.DataFrame:
    """Mean score after the edit per layer (``traced``: whether causal tracing marks the layer)."""
    t = frame.groupby("layer")[[f"{s}_after" for s in SCORES]].mean().reset_index()
    t.columns = ["layer", *SCORES]
    t["traced"] = t["layer"].isin(list(traced))
    return t


def tracing_effects(trace: CausalTrace, facts: Sequence[Example]) -> dict[tuple[Any, int], float]:
    """``{(case_id, layer): indirect effect}`` of restoring the MLP state at the fact's last
    subject token (the effect Hase et al. 2023 regress edit success on)."""
    out = {}
    for rec in trace.per_prompt_:
        fact = facts[rec["index"]]
        grid = rec["grids"]["mlp"]
        last_subject = rec["subject_range"][1] - 1
        for layer in range(grid.shape[1]):
            out[fact.meta.get("case_id", rec["index"]), layer] = float(grid[last_subject, layer])
    return out


def r_squared(y: np.ndarray, x: np.ndarray) -> float:
    """R² of the least-squares fit of ``y`` on the columns of ``x`` plus an intercept (NaN when
    ``y`` is constant)."""
    y = np.asarray(y, dtype=float)
    design = np.column_stack([np.ones(len(y)), x])
    coef, *_ = np.linalg.lstsq(design, y, rcond=None)
    total = float(((y - y.mean()) ** 2).sum())
    return float(1 - ((y - design @ coef) ** 2).sum() / total) if total > 0 else float("nan")


def edit_regression(frame: pd.DataFrame, effects: dict[tuple[Any, int], float]) -> pd.DataFrame:
    """Hase et al. (2023, Sec. 4): how much of edit success the edit layer explains (one
    indicator per layer), how much the tracing effect at that (fact, layer) explains, and both
    together; R² per score after the edit. Rows without a traced effect, or without an edit (a layer
    that cannot reach the answer: NaN scores), are dropped."""
    effect = np.array([effects.get((c, l), np.nan) for c, l in zip(frame["case_id"], frame["layer"])])
    keep = ~np.isnan(effect) & frame[[f"{s}_after" for s in SCORES]].notna().all(axis=1).to_numpy()
    f, effect = frame[keep], effect[keep]
    layers = pd.get_dummies(f["layer"].astype(int), drop_first=True).to_numpy(dtype=float)
    rows = []
    for score in SCORES:
        y = f[f"{score}_after"].to_numpy(dtype=float)
        rows += [
            {"score": score, "predictors": name, "r2": r_squared(y, x), "n": len(y)}
            for name, x in (
                ("layer", layers),
                ("tracing effect", effect[:, None]),
                ("layer + tracing effect", np.column_stack([layers, effect])),
            )
        ]
    return pd.DataFrame(rows)


def _figure(table: pd.DataFrame, traced: Sequence[int]) -> go.Figure:
    fig = go.Figure([go.Scatter(x=table["layer"], y=table[s], mode="lines+markers", name=s) for s in SCORES])
    for l in traced:
        fig.add_vline(x=l, line_dash="dot", line_color="gray")
    fig.update_layout(
        title="ROME edit scores by edited layer (dotted: causally traced MLP layers)",
        xaxis_title="edited layer",
        yaxis_title="score (share of prompts)",
        yaxis_range=[0, 1.05],
    )
    return fig


@experiment("rome_layers", "Reliability of parameter layers: ROME edits at every layer (Huang et al. 2025, Fig. 2)")
def run(ctx: Context) -> ExperimentResult:
    """Known CounterFact facts; ROME at every layer (quick: 1 fact, the top traced and one untraced layer); traced layers marked."""
    model = ctx.model
    n_layers = int(model.cfg.n_layers)
    facts = known_counterfact(model, ctx.size(1, 10))
    trace = CausalTrace(
        model, kinds=("mlp",), samples=ctx.size(3, 10), top_k=3, require_correct=False, progress=False
    ).fit(facts)
    traced = [int(l) for l in trace.layers_]
    # quick: the top traced layer and the first untraced layer from the middle up
    other = next(l for l in [*range(n_layers // 2, n_layers), *range(n_layers // 2)] if l not in traced)
    layers = sorted({traced[0], other}) if ctx.quick else list(range(n_layers))
    texts = local_texts(n=ctx.size(24, 400), seed=ctx.seed) if data_file(COUNTERFACT) is not None else None
    params: dict[str, Any] = dict(
        steps=ctx.size(8, 20), n_prefixes=ctx.size(2, 5), prefix_tokens=ctx.size(5, 8), seed=ctx.seed
    )
    if texts is not None:
        params["texts"] = texts
    else:  # no local corpus: the facts' own prompts stand in (C is then a rough estimate)
        params["texts"] = [f.prompt for f in facts] * 8
    frame = layer_frame(model, facts, layers, ctx, **params)
    table = layer_summary(frame, traced)
    inside, outside = table[table["traced"]], table[~table["traced"]]
    gap = {s: float(inside[s].mean() - outside[s].mean()) if len(inside) and len(outside) else np.nan for s in SCORES}
    info = {
        "traced_layers": traced,
        "layers": layers,
        "n_facts": len(facts),
        "case_ids": [f.meta.get("case_id") for f in facts],
        "traced_minus_other": gap,
        "hase_regression": edit_regression(frame, tracing_effects(trace, facts)).to_dict("records"),
        "hase_paper": "GPT-J, CounterFact rewrite score: R² 0.947 (edit layer), 0.016 (tracing effect) (Hase et al. 2023)",
        "rome_params": {k: v for k, v in params.items() if k != "texts"},
        "n_corpus_texts": len(params["texts"]),
        "paper": "GPT-J, CounterFact: efficacy / paraphrase / specificity similar at every layer (Fig. 2)",
        "notes": "Scores after the edit; before it efficacy is 0 by the choice of facts.",
    }
    return ExperimentResult("rome_layers", "ROME edit scores by layer", table, _figure(table, traced), info)
