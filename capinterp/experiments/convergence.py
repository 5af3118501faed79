"""Split-half consistency against data size (Huang et al. 2025, Appendix E and Fig. 6).

The paper's central claim is that capability neurons are *common*: two disjoint halves of a
dataset locate nearly the same neurons (90-98 % overlap, Table 1, from 350-1,200 examples per
half), and Fig. 6 shows the consistency growing with the data. This experiment measures that
curve: for each dataset and each size ``n`` per half, several seeded random splits, each half
localized independently (CNL and DCSN), overlap |A∩B|/min(|A|,|B|) and IoU |A∩B|/|A∪B| of the
two sets at sigma = 6, and the ratio of located neurons |N| / (L·d_mlp).

**Blocks.** CNL and DCSN scores are means of per-example scores, so the scores of any union of
disjoint example sets are the size-weighted mean of theirs. The dataset's pool (``2 * max(sizes)``
seeded-shuffled examples) is cut into blocks of ``block`` examples, each block is fitted once
(through ``localize``: cached and checkpointed, so a long run resumes where it stopped), and a
half of ``n`` examples is ``n / block`` randomly drawn blocks -- exactly the scores a fit on
those ``n`` examples gives, at a cost of one fit of the pool for every size and split together.
Splits are random at block granularity: split ``r`` at size ``n`` draws ``2n / block`` distinct
blocks with its own seed and gives the first half of them to A and the rest to B.

Examples use the datasets' gold answers (no solved-first filtering: the paper localizes on the
datasets as given); code targets are cut to their first 5 tokens as in the other capability
experiments. The time per example is the blocks' recorded fit time (kept with the cached
scores, so a resumed run still reports it) and ``seconds_per_size`` = 2 n x that time (both
halves, one process).
"""

from __future__ import annotations

import random
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd
import plotly.graph_objects as go
import torch

from capinterp.core import validate
from capinterp.core.example import Example, as_examples
from capinterp.core.protocol import Model
from capinterp.experiments import capability_data as cd
from capinterp.experiments.base import Context, ExperimentResult, experiment
from capinterp.experiments.commonality import SPLIT_COLUMNS, split_stats
from capinterp.localizers.dataset import fill_greedy_targets
from capinterp.units.neurons import NeuronScores

__all__ = [
    "COLUMNS",
    "FULL_PLAN",
    "QUICK_PLAN",
    "Track",
    "block_scores",
    "combine",
    "convergence_figure",
    "convergence_table",
    "load_track",
    "run",
    "run_plan",
    "split_blocks",
    "summarize",
]

NAME, TITLE = "convergence", "Split-half consistency against data size (Huang et al. 2025, App. E, Fig. 6)"
COLUMNS = ["dataset", "method", "n_per_half", "split", *SPLIT_COLUMNS]
SUMMARY_COLUMNS = [
    "dataset",
    "method",
    "n_per_half",
    "n_splits",
    "overlap_mean",
    "overlap_std",
    "overlap_min",
    "overlap_max",
    "iou_mean",
    "iou_std",
    "ratio_pct_mean",
    "seconds_per_size",
]
#: Huang et al. 2025, Table 1 (CNL, overlap %, 350-1,200 examples per half), for the datasets here.
PAPER_OVERLAP = {"GSM8K": (94.26, 96.42), "Emotion": (87.62, 97.93), "Imdb": (95.81, 98.32), "Code25K": (90.14, 91.25)}


@dataclass(frozen=True)
class Track:
    """One dataset of the curve: capability ``capability`` from ``source``, up to ``max_per_half``."""

    label: str
    capability: str
    source: str | None
    max_per_half: int


#: The issue's full run: two datasets to 400 per half (one arithmetic, one real), the others to 200.
FULL_PLAN: tuple[Track, ...] = (
    Track("sub", "sub", "generated", 400),
    Track("emotion", "sentiment", "emotion", 400),
    Track("gsm8k", "math_word", "gsm8k", 200),
    Track("imdb", "sentiment", "imdb", 200),
    Track("mbpp", "code", "mbpp", 200),
)
FULL_SIZES = (25, 50, 100, 200, 400, 800)
#: Quick mode (CI): one generated capability, two small sizes.
QUICK_PLAN: tuple[Track, ...] = (Track("sub", "sub", "generated", 6),)
QUICK_SIZES = (3, 6)


def load_track(model: Model, track: Track, n: int, seed: int = 0) -> list[Example]:
    """``n`` seeded train-split examples of ``track`` with gold targets (code cut to 5 tokens)."""
    from capinterp.data.capabilities import load_capability

    exs = fill_greedy_targets(
        model, load_capability(track.capability, n, seed=seed, split="train", source=track.source)
    )
    limit = cd.MAX_TARGET_TOKENS.get(track.capability)
    return cd.cut_targets(model, exs, limit) if limit else exs


def split_blocks(n_blocks: int, k: int, n_splits: int, seed: int, tag: str = "") -> list[tuple[list[int], list[int]]]:
    """``n_splits`` seeded pairs of disjoint block lists of ``k`` blocks each, out of ``n_blocks``."""
    if 2 * k > n_blocks:
        raise ValueError(f"two halves of {k} blocks need {2 * k} blocks, the pool has {n_blocks}")
    out = []
    for r in range(n_splits):
        drawn = random.Random(f"capinterp-convergence|{tag}|{seed}|{k}|{r}").sample(range(n_blocks), 2 * k)
        out.append((sorted(drawn[:k]), sorted(drawn[k:])))
    return out


def block_scores(blocks: Sequence[NeuronScores], n_examples: int) -> NeuronScores:
    """The mean of equal-size blocks' scores: the scores of one fit on their union."""
    mean = torch.stack([b.scores.double() for b in blocks]).mean(0)
    return NeuronScores(mean, meta={**blocks[0].meta, "n_samples": n_examples, "pooled_blocks": len(blocks)})


def convergence_table(
    model: Model,
    datasets: Mapping[str, Sequence[Example]],
    *,
    sizes: Sequence[int],
    block: int,
    n_splits: int = 3,
    methods: Sequence[str] = ("cnl", "dcsn"),
    params: Mapping[str, Mapping[str, Any]] | None = None,
    sigma: float = 6.0,
    seed: int = 0,
    localize: cd.Localize | None = None,
    progress: Callable[[str], None] | None = None,
) -> tuple[pd.DataFrame, dict[str, float]]:
    """One row per (dataset, method, size per half, split): overlap, IoU and ratio at ``sigma``.

    Each dataset's examples are shuffled with ``seed`` and cut into blocks of ``block``; sizes
    above half the dataset are left out. Returns the table and the seconds per example of each
    ``"dataset/method"``: the blocks' recorded ``meta["fit_seconds"]`` (``Context.localize``
    records them, cached blocks keep them; absent when a block has none).
    """
    block = validate.positive_int("block", block)
    n_splits = validate.positive_int("n_splits", n_splits)
    sizes = sorted({validate.positive_int("size", s) for s in sizes})
    if not sizes:
        raise ValueError("convergence needs at least one size per half")
    bad = [s for s in sizes if s % block]
    if bad:
        raise ValueError(f"every size per half must be a multiple of block={block}; got {bad}")
    if not datasets:
        raise ValueError("convergence needs at least one dataset")
    localize = localize or cd.default_localize(model)
    rows, timing = [], {}
    for name, data in datasets.items():
        exs = as_examples(data)
        fits = [s for s in sizes if 2 * s <= len(exs)]
        if not fits:
            raise ValueError(f"dataset {name!r} has {len(exs)} examples, too few for two halves of {sizes[0]}")
        order = list(range(len(exs)))
        random.Random(f"capinterp-convergence|{name}|{seed}").shuffle(order)
        pool = [exs[i] for i in order[: 2 * fits[-1]]]
        chunks = [pool[j : j + block] for j in range(0, len(pool), block)]
        for method in methods:
            kw = dict((params or {}).get(method, {}))
            cache: dict[int, NeuronScores] = {}

            def get(j: int) -> NeuronScores:
                if j not in cache:
                    if progress:
                        progress(f"convergence {name} {method} block {len(cache) + 1}/{len(chunks)}")
                    cache[j] = localize(method, f"{name}-blk{j}-{cd.data_hash(chunks[j])}", chunks[j], **kw)
                return cache[j]

            for n in fits:
                for r, (ia, ib) in enumerate(split_blocks(len(chunks), n // block, n_splits, seed, name)):
                    a = block_scores([get(j) for j in ia], n).select(sigma=sigma)
                    b = block_scores([get(j) for j in ib], n).select(sigma=sigma)
                    rows.append(
                        {
                            "dataset": name,
                            "method": method,
                            "n_per_half": n,
                            "split": r,
                            **split_stats(a, b),
                        }
                    )
            spent = [cache[j].meta.get("fit_seconds") for j in cache]
            known = [s for s in spent if s is not None]
            if spent and len(known) == len(spent):
                timing[f"{name}/{method}"] = sum(known) / sum(len(chunks[j]) for j in cache)
    return pd.DataFrame(rows, columns=COLUMNS), timing


def summarize(table: pd.DataFrame, timing: Mapping[str, float] | None = None) -> pd.DataFrame:
    """Per (dataset, method, size): mean / spread over splits, in percent; time for both halves."""
    g = table.groupby(["dataset", "method", "n_per_half"], sort=False)
    out = pd.DataFrame(
        {
            "n_splits": g.size(),
            "overlap_mean": 100 * g["overlap"].mean(),
            "overlap_std": 100 * g["overlap"].std(ddof=0),
            "overlap_min": 100 * g["overlap"].min(),
            "overlap_max": 100 * g["overlap"].max(),
            "iou_mean": 100 * g["iou"].mean(),
            "iou_std": 100 * g["iou"].std(ddof=0),
            "ratio_pct_mean": g["ratio_pct"].mean(),
        }
    ).reset_index()
    per_example = [(timing or {}).get(f"{d}/{m}", float("nan")) for d, m in zip(out["dataset"], out["method"])]
    out["seconds_per_size"] = [2 * n * t for n, t in zip(out["n_per_half"], per_example)]
    return out[SUMMARY_COLUMNS].round(3)


def convergence_figure(summary: pd.DataFrame) -> go.Figure:
    """The paper's Fig. 6: mean split-half overlap against examples per half, one line per
    dataset and method (and model, where ``summary`` has a ``model`` column, see :func:`combine`;
    error bars: spread over splits)."""
    fig = go.Figure()
    keys = ["model", "dataset", "method"] if "model" in summary else ["dataset", "method"]
    for key, sub in summary.groupby(keys, sort=False):
        *labels, method = key
        fig.add_scatter(
            x=sub["n_per_half"],
            y=sub["overlap_mean"],
            error_y={"type": "data", "array": sub["overlap_std"]},
            mode="lines+markers",
            name=" / ".join([*labels, method.upper()]),
            line={"dash": "solid" if method == "cnl" else "dot"},
            customdata=sub[["iou_mean", "ratio_pct_mean", "n_splits"]],
            hovertemplate="%{x} per half: overlap %{y:.1f}%<br>IoU %{customdata[0]:.1f}%, ratio "
            "%{customdata[1]:.3f}%, %{customdata[2]} splits<extra></extra>",
        )
    fig.add_hline(y=90, line_dash="dash", annotation_text="90 % (paper: 90-98 % at 350-1,200 per half)")
    fig.update_layout(
        title="Split-half consistency of located neurons against data size",
        xaxis={"title": "examples per half", "type": "log"},
        yaxis={"title": "overlap (%)", "range": [0, 100]},
    )
    return fig


def combine(runs: Iterable[tuple[str, pd.DataFrame]]) -> pd.DataFrame:
    """Stack the summary tables of several runs, each as ``(label, summary)``; the label (e.g. the
    model, shared by its runs of different tracks) becomes the leading ``model`` column. Draw with
    :func:`convergence_figure`."""
    runs = list(runs)
    if not runs:
        raise ValueError("combine needs at least one summary table")
    for label, summary in runs:
        missing = [c for c in SUMMARY_COLUMNS if c not in summary]
        if missing:
            raise ValueError(f"summary {label!r} is not a convergence summary: it lacks {missing}")
    parts = [summary[SUMMARY_COLUMNS].assign(model=label) for label, summary in runs]
    out = pd.concat(parts, ignore_index=True)[["model", *SUMMARY_COLUMNS]]
    twice = out[out.duplicated(["model", "dataset", "method", "n_per_half"], keep=False)]
    if len(twice):
        first = twice.iloc[0]
        raise ValueError(
            f"{first['model']!r} has {first['dataset']}/{first['method']} at {first['n_per_half']} per half "
            "in more than one run; give each run its own label"
        )
    return out


@experiment(NAME, TITLE)
def run(ctx: Context) -> ExperimentResult:
    """CNL and DCSN split-half consistency at growing sizes per half (quick: "sub", 3 and 6)."""
    if ctx.quick:
        return run_plan(ctx, QUICK_PLAN, QUICK_SIZES, block=3, n_splits=2)
    return run_plan(ctx, FULL_PLAN, FULL_SIZES, block=25, n_splits=3)


def run_plan(
    ctx: Context, plan: Sequence[Track], sizes: Sequence[int], *, block: int, n_splits: int
) -> ExperimentResult:
    """The experiment on the datasets of ``plan`` (each up to its ``max_per_half``), e.g. a subset
    of :data:`FULL_PLAN` (``scripts/convergence.py``); fits are cached in ``ctx.workdir``."""
    if not plan:
        raise ValueError("convergence needs at least one track")
    ig = ctx.ig(4, 20)  # the papers' 20-point rule in full mode (three rows per layer on Gemma 3)
    params = {"cnl": {"steps": ig["steps"]} if ig["rule"] == "right" else ig, "dcsn": {}}
    datasets = {}
    for t in plan:
        wanted = [s for s in sizes if s <= t.max_per_half]
        if not wanted:
            raise ValueError(f"track {t.label!r} allows {t.max_per_half} per half, below every size {list(sizes)}")
        datasets[t.label] = load_track(ctx.model, t, 2 * max(wanted), seed=ctx.seed)
    progress = (lambda msg: print(msg, file=sys.stderr, flush=True)) if ctx.progress else None
    table, timing = convergence_table(
        ctx.model,
        datasets,
        sizes=sizes,
        block=block,
        n_splits=n_splits,
        params=params,
        seed=ctx.seed,
        localize=ctx.localize,
        progress=progress,
    )
    summary = summarize(table, timing)
    reach = {}
    for (dataset, method), sub in summary.groupby(["dataset", "method"], sort=False):
        hit = sub[sub["overlap_mean"] >= 90]
        reach[f"{dataset}/{method}"] = int(hit["n_per_half"].min()) if len(hit) else None
    info = {
        "splits": table.to_dict("records"),
        "first_size_reaching_90pct_overlap": reach,
        "seconds_per_example": timing,
        "paper_cnl_overlap_pct_range": PAPER_OVERLAP,
        "settings": {
            "plan": [t.__dict__ for t in plan],
            "sizes": list(sizes),
            "block": block,
            "n_splits": n_splits,
            "sigma": 6.0,
            "params": params,
        },
        "notes": [
            "Halves are unions of seeded random blocks; block scores are cached, so a rerun resumes.",
            "seconds_per_size: both halves at that size in one process, from the blocks' recorded fit times.",
            "Gold answers from each dataset's train split (no solved-first filter).",
        ],
    }
    return ExperimentResult(NAME, TITLE, summary, convergence_figure(summary), info)
