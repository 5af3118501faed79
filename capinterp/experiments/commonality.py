"""Split-half consistency of capability neurons per capability (Huang et al. 2025, Sec. 5.3, Table 1).

Each capability's localization examples (solved ones first, train split; see
:mod:`capinterp.experiments.capability_data`) are split into two seeded disjoint halves; CNL (and
DCSN, one forward per example, as a cheap comparison) localize each half independently, and the
two neuron sets at ``sigma`` are compared: overlap |A∩B|/min(|A|,|B|), IoU |A∩B|/|A∪B|, and ratio
(|N| / (L·d_mlp), mean of the halves). Each half's fit is cached through ``Context.localize``, so
a rerun resumes and the erase / cross-capability experiments reuse the same fits.
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
from capinterp.units import metrics

__all__ = ["COLUMNS", "PAPER_TABLE1", "SPLIT_COLUMNS", "commonality_figure", "commonality_table", "run", "split_stats"]

NAME, TITLE = "commonality", "Split-half consistency of capability neurons (Huang et al. 2025, Table 1)"

#: Huang et al. 2025, Table 1 (percent): overlap, IoU and ratio per dataset, CNL on 7B-13B models with
#: 350-1200 examples per half.
PAPER_TABLE1: dict[str, dict[str, dict[str, float]]] = {
    "Llama2-7B": {
        "overlap": {"GSM8K": 96.42, "Emotion": 97.93, "Code25K": 90.14, "Meta_Math": 94.33, "Imdb": 95.81},
        "iou": {"GSM8K": 93.08, "Emotion": 95.95, "Code25K": 82.05, "Meta_Math": 89.15, "Imdb": 91.96},
        "ratio": {"GSM8K": 0.14, "Emotion": 0.19, "Code25K": 0.11, "Meta_Math": 0.14, "Imdb": 0.19},
    },
    "Llama2-13B": {
        "overlap": {"GSM8K": 94.26, "Emotion": 94.68, "Code25K": 91.10, "Meta_Math": 95.37, "Imdb": 98.32},
        "iou": {"GSM8K": 88.92, "Emotion": 89.79, "Code25K": 83.62, "Meta_Math": 91.10, "Imdb": 96.68},
        "ratio": {"GSM8K": 0.10, "Emotion": 0.19, "Code25K": 0.11, "Meta_Math": 0.09, "Imdb": 0.08},
    },
    "GPTJ-6B": {
        "overlap": {"GSM8K": 95.66, "Emotion": 87.62, "Code25K": 91.25, "Meta_Math": 83.62, "Imdb": 98.27},
        "iou": {"GSM8K": 91.63, "Emotion": 77.96, "Code25K": 83.89, "Meta_Math": 71.77, "Imdb": 96.60},
        "ratio": {"GSM8K": 0.28, "Emotion": 0.19, "Code25K": 0.11, "Meta_Math": 0.27, "Imdb": 0.26},
    },
}
#: What :func:`split_stats` returns for two halves, in this order.
SPLIT_COLUMNS = ["overlap", "overlap_chance", "iou", "iou_chance", "p_value", "ratio_pct", "n_a", "n_b", "n_common"]
COLUMNS = ["capability", "method", "n_per_half", "sigma", *SPLIT_COLUMNS]


def split_stats(a: Any, b: Any) -> dict[str, float]:
    """Overlap, IoU (each beside its chance level for random sets of the same sizes, and the
    p-value of the intersection), mean ratio (%) and sizes of two halves' located sets."""
    return {
        "overlap": metrics.overlap(a, b),
        "iou": metrics.iou(a, b),
        **metrics.chance_stats(a, b),
        "ratio_pct": 100 * (a.ratio + b.ratio) / 2,
        "n_a": len(a),
        "n_b": len(b),
        "n_common": metrics.intersection_size(a, b),
    }


def commonality_table(
    model: Model,
    datasets: Mapping[str, Sequence[Example]],
    *,
    methods: Sequence[str] = ("cnl", "dcsn"),
    params: Mapping[str, Mapping[str, Any]] | None = None,
    sigma: float = 6.0,
    seed: int = 0,
    localize: cd.Localize | None = None,
    device: Any = None,
) -> pd.DataFrame:
    """One row per (capability, method): split-half overlap, IoU and ratio at ``sigma``.

    Args:
        datasets: capability name -> localization examples (split into two seeded halves).
        methods: dataset localizers by registry name.
        params: per-method localizer hyper-parameters (e.g. ``{"cnl": {"steps": 8}}``); they are
            part of the cache key, so keep them equal across experiments that share fits.
        sigma: the mask threshold applied to each half's scores.
        localize: ``localize(method, data_name, examples, **params)``, e.g. ``Context.localize``
            (cached); default: an uncached fit per call.
    """
    cd.on_device(model, device)
    localize = localize or cd.default_localize(model)
    rows = []
    for name, data in datasets.items():
        exs = as_examples(data)
        for method in methods:
            sa, sb = cd.half_scores(localize, method, name, exs, seed, **dict((params or {}).get(method, {})))
            a, b = sa.select(sigma=sigma), sb.select(sigma=sigma)
            rows.append(
                {
                    "capability": name,
                    "method": method,
                    "n_per_half": len(exs) // 2,
                    "sigma": float(sigma),
                    **split_stats(a, b),
                }
            )
    return pd.DataFrame(rows, columns=COLUMNS)


def commonality_figure(table: pd.DataFrame) -> go.Figure:
    """Grouped bars: overlap (solid) and IoU (hatched) per capability, one colour per method."""
    fig = go.Figure()
    for method, sub in table.groupby("method", sort=False):
        fig.add_bar(
            x=sub["capability"],
            y=100 * sub["overlap"],
            name=f"{method.upper()} overlap",
            customdata=sub[["n_per_half", "n_a", "n_b", "ratio_pct"]],
            hovertemplate="%{x}: overlap %{y:.1f}%<br>per half %{customdata[0]}, sizes "
            "%{customdata[1]}/%{customdata[2]}, ratio %{customdata[3]:.3f}%<extra></extra>",
        )
        fig.add_bar(
            x=sub["capability"],
            y=100 * sub["iou"],
            name=f"{method.upper()} IoU",
            marker_pattern_shape="/",
            hovertemplate="%{x}: IoU %{y:.1f}%<extra></extra>",
        )
    fig.update_layout(
        barmode="group",
        yaxis_title="% (split-half)",
        yaxis_range=[0, 100],
        title="Split-half consistency of located neurons",
    )
    return fig


@experiment(NAME, TITLE)
def run(ctx: Context) -> ExperimentResult:
    """Table 1 on the capability datasets: CNL and DCSN split-half consistency at sigma 6."""
    s = cd.settings(ctx)
    data = cd.prepared(ctx, s)
    table = commonality_table(
        ctx.model, {k: d.locate for k, d in data.items()}, params=s["params"], seed=ctx.seed, localize=ctx.localize
    )
    table.insert(3, "n_solved", table["capability"].map({k: d.n_solved for k, d in data.items()}))
    cnl = table[table["method"] == "cnl"]
    info = {
        "paper": {"table1_pct": PAPER_TABLE1},
        "cnl_mean_overlap": float(cnl["overlap"].mean()),
        "cnl_mean_iou": float(cnl["iou"].mean()),
        "settings": {**s, "capabilities": list(s["capabilities"]), "sigma": 6.0},
        "notes": [
            "overlap and IoU are fractions; ratio_pct = |N|/(L*d_mlp) in percent (the paper's 'ratio').",
            "n_solved: how many of the 2*n_per_half localization examples the model solves "
            "(the rest are its most probable unsolved ones).",
            "The paper uses 350-1200 examples per half on 6-13B models; consistency grows with data "
            "(its Appendix E), so a few examples per half give far lower overlap.",
        ],
    }
    return ExperimentResult(NAME, TITLE, table, commonality_figure(table), info)
