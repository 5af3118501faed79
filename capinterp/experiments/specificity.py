"""Cohesion and separability of capability-specific neurons (the DCSN paper, anon. 2025, Table 3, Eq. 3).

DCSN locates each operator's neurons (``+ - * /``) on 1-OP arithmetic in several *conditions*
(format DG/MQ/TF, language en/zh, template style). Then, with ``|A ∩ B| / max(|A|, |B|)``:

- cohesion: one operator, two conditions (formats, languages, or a resample of the same
  condition with another seed: the sampling-noise ceiling); high is good (paper: ~94%);
- separability: two operators, one condition; low is good (paper: ~3-6%).

IoU and the overlap coefficient are reported beside every value. Language pairs use formats
whose prompts differ between en and zh: in the compact style a DG prompt is ``3+4=`` in both,
so DG en/zh is compared with the paper's long templates (``DGp``, one shot) instead.
Pooled sets ("EN", "ZH") average the per-example scores of several conditions (weighted by
the examples used) and are masked again. Neurons are located on the examples the model
answers right (greedy first token, :func:`~capinterp.experiments.dcsn_common.correct_scores`).

NeFT (Xu et al. 2025; the DCSN paper's Appendix C baseline) is measured the same way beside DCSN: a
short full fine-tune on each dataset (:class:`capinterp.NeFT`, SGD), the neurons whose weights
turned most, as many as DCSN's set of the same key, then the same cohesion and separability
rows (column ``method``). Quick mode fits NeFT on :data:`QUICK_NEFT_CONDITIONS` only.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any, cast

import pandas as pd
import torch

from capinterp.core.example import Example
from capinterp.core.protocol import Model
from capinterp.experiments.base import Context, ExperimentResult, experiment
from capinterp.experiments.dcsn_common import (
    OP_NAMES,
    OPS,
    Scorer,
    context_scorer,
    direct_scorer,
    one_op_data,
    one_op_name,
)
from capinterp.units import metrics
from capinterp.units.neurons import NeuronScores, NeuronSet

__all__ = [
    "CONDITIONS",
    "NEFT",
    "PAIRS",
    "PAPER",
    "PAPER_SEP_PAIRS",
    "POOLS",
    "QUICK_CONDITIONS",
    "QUICK_NEFT_CONDITIONS",
    "QUICK_PAIRS",
    "TITLE",
    "Key",
    "build_datasets",
    "compare_sets",
    "like_sized",
    "locate_all",
    "neft_scores",
    "pool_scores",
    "run",
    "specificity_table",
    "summarize",
]

Key = tuple[str, str]  # (operator, condition)

CONDITIONS: dict[str, dict[str, Any]] = {
    "DG-en": {"fmt": "DG", "lang": "en"},
    "MQ-en": {"fmt": "MQ", "lang": "en", "shots": 2},
    "TF-en": {"fmt": "TF", "lang": "en"},
    "MQ-zh": {"fmt": "MQ", "lang": "zh", "shots": 2},
    "TF-zh": {"fmt": "TF", "lang": "zh"},
    "DGp-en": {"fmt": "DG", "lang": "en", "style": "fewshot", "shots": 1},
    "DGp-zh": {"fmt": "DG", "lang": "zh", "style": "fewshot", "shots": 1},
    "DG-en-s1": {"fmt": "DG", "lang": "en", "seed_offset": 1},
}
PAIRS: list[tuple[str, str, str]] = [
    ("DG-en", "MQ-en", "format"),
    ("DG-en", "TF-en", "format"),
    ("MQ-en", "TF-en", "format"),
    ("MQ-en", "MQ-zh", "language"),
    ("TF-en", "TF-zh", "language"),
    ("DGp-en", "DGp-zh", "language"),
    ("EN", "ZH", "language (pooled)"),
    ("DG-en", "DG-en-s1", "resample"),
]
POOLS: dict[str, list[str]] = {"EN": ["MQ-en", "TF-en", "DGp-en"], "ZH": ["MQ-zh", "TF-zh", "DGp-zh"]}
QUICK_CONDITIONS = ["DG-en", "TF-en", "TF-zh", "DG-en-s1"]
QUICK_PAIRS = [("DG-en", "TF-en", "format"), ("TF-en", "TF-zh", "language"), ("DG-en", "DG-en-s1", "resample")]
#: Quick mode fits NeFT on these conditions only (every NeFT fit fine-tunes the whole model): the
#: resample pair gives NeFT's cohesion ceiling and each condition its separability rows; the full
#: run fits NeFT on every condition, as DCSN.
QUICK_NEFT_CONDITIONS = ["DG-en", "DG-en-s1"]
TITLE = "Capability-specific neurons (DCSN paper, anon. 2025): cohesion and separability"
PAPER_SEP_PAIRS = {("+", "-"), ("+", "*"), ("+", "/"), ("*", "/")}
PAPER = {  # Table 3 (cohesion: LLaMA-2-7B; separability: LLaMA-3-8B), percent
    "cohesion_avg": {"DG": 94.19, "TF": 94.26, "MQ": 94.13, "CH": 82.97},
    "separability_avg": {"DG": 3.65, "MQ": 4.73, "TF": 4.82, "CH": 4.57, "EN": 4.84},
    "separability_pairs": ["+∩-", "+∩*", "+∩/", "*∩/"],
}
#: NeFT's fine-tune in the experiment (SGD): see :class:`capinterp.NeFT`. Quick mode takes 1 step, on
#: :data:`QUICK_NEFT_CONDITIONS`: its 6 examples are one batch, so a second step would repeat the
#: first one's gradient at nearly the same weights (and cost about two thirds as much again).
NEFT: dict[str, Any] = {"steps": 10, "lr": 1e-3}


def build_datasets(
    conditions: Mapping[str, Mapping[str, Any]], n: int, seed: int, ops: Sequence[str] = OPS
) -> tuple[dict[Key, list[Example]], dict[Key, str]]:
    """``n`` 1-OP examples per (operator, condition), and their cache names; a condition's
    ``seed_offset`` shifts the seed."""
    data: dict[Key, list[Example]] = {}
    names: dict[Key, str] = {}
    for cond, spec in conditions.items():
        spec = dict(spec)
        s = seed + int(spec.pop("seed_offset", 0))
        for op in ops:
            data[(op, cond)] = one_op_data(op, n, s, **spec)
            names[(op, cond)] = one_op_name(op, s, **spec)
    return data, names


def locate_all(
    datasets: Mapping[Key, list[Example]], scorer: Scorer, names: Mapping[Key, str] | None = None
) -> dict[Key, NeuronScores]:
    """DCSN scores of every dataset; ``scorer(name, examples)`` may cache by ``name``."""
    names = names or {k: f"{OP_NAMES[k[0]]}_{k[1]}" for k in datasets}
    return {k: scorer(names[k], ex) for k, ex in datasets.items()}


def pool_scores(scores: Mapping[Key, NeuronScores], pools: Mapping[str, Sequence[str]]) -> dict[Key, NeuronScores]:
    """Per operator, the example-weighted mean of the scores of each pool's conditions."""
    out: dict[Key, NeuronScores] = {}
    ops = dict.fromkeys(op for op, _ in scores)
    for name, conds in pools.items():
        for op in ops:
            parts = [scores[(op, c)] for c in conds if (op, c) in scores]
            if not parts:
                continue
            w = [float(p.meta.get("n_samples", 1)) for p in parts]
            mean = cast(torch.Tensor, sum(p.scores.double() * wi for p, wi in zip(parts, w))) / sum(w)  # parts: >= 1
            meta = {**parts[0].meta, "dataset": f"pool {name}: {', '.join(conds)}", "n_samples": int(sum(w))}
            out[(op, name)] = NeuronScores(mean.float(), meta)
    return out


def _row(metric: str, kind: str, comparison: str, op_a: str, op_b: str, a: NeuronSet, b: NeuronSet) -> dict[str, Any]:
    return {
        "metric": metric,
        "kind": kind,
        "comparison": comparison,
        "op_a": op_a,
        "op_b": op_b,
        "n_a": len(a),
        "n_b": len(b),
        "intersection": metrics.intersection_size(a, b),
        "value": metrics.cohesion(a, b),
        "value_chance": metrics.chance(a, b, "cohesion").expected,
        "iou": metrics.iou(a, b),
        "overlap": metrics.overlap(a, b),
        **metrics.chance_stats(a, b),
        "paper_pair": metric == "cohesion" or (op_a, op_b) in PAPER_SEP_PAIRS,
    }


def compare_sets(
    sets: Mapping[Key, NeuronSet], pairs: Sequence[tuple[str, str, str]], sep_conditions: Sequence[str] | None = None
) -> pd.DataFrame:
    """Cohesion rows (each operator, each condition pair) and separability rows (each condition,
    each operator pair). Columns: metric, kind, comparison, op_a, op_b, n_a, n_b, intersection,
    value (= |A∩B|/max), iou, overlap, paper_pair (one of the paper's four Sep pairs)."""
    ops = list(dict.fromkeys(op for op, _ in sets))
    conds = list(dict.fromkeys(c for _, c in sets))
    rows = []
    for a, b, kind in pairs:
        for op in ops:
            if (op, a) in sets and (op, b) in sets:
                rows.append(_row("cohesion", kind, f"{a} vs {b}", op, op, sets[(op, a)], sets[(op, b)]))
    for cond in conds if sep_conditions is None else sep_conditions:
        for oa, ob in itertools.combinations(ops, 2):
            if (oa, cond) in sets and (ob, cond) in sets:
                rows.append(_row("separability", "operators", cond, oa, ob, sets[(oa, cond)], sets[(ob, cond)]))
    return pd.DataFrame(
        rows,
        columns=[
            "metric",
            "kind",
            "comparison",
            "op_a",
            "op_b",
            "n_a",
            "n_b",
            "intersection",
            "value",
            "iou",
            "overlap",
            "paper_pair",
        ],
    )


def specificity_table(
    model: Model,
    datasets: Mapping[Key, list[Example]],
    *,
    pairs: Sequence[tuple[str, str, str]],
    pools: Mapping[str, Sequence[str]] | None = None,
    sigma: float = 6.0,
    scorer: Scorer | None = None,
    batch_size: int = 16,
) -> pd.DataFrame:
    """Locate (``scorer`` or uncached DCSN on correct examples), pool, mask at ``sigma``, compare."""
    scores = locate_all(datasets, scorer or direct_scorer(model, batch_size=batch_size))
    scores.update(pool_scores(scores, pools or {}))
    return compare_sets({k: s.select(sigma=sigma) for k, s in scores.items()}, pairs)


def summarize(table: pd.DataFrame) -> dict[str, Any]:
    """Mean cohesion per kind, mean separability (paper pairs and all pairs) per condition, in %."""
    coh = table[table.metric == "cohesion"]
    sep = table[table.metric == "separability"]
    return {
        "cohesion_mean_by_kind": (100 * coh.groupby("kind")["value"].mean()).round(2).to_dict(),
        "cohesion_mean_by_comparison": (100 * coh.groupby("comparison")["value"].mean()).round(2).to_dict(),
        "separability_mean_paper_pairs": (100 * sep[sep.paper_pair].groupby("comparison")["value"].mean())
        .round(2)
        .to_dict(),
        "separability_mean_all_pairs": (100 * sep.groupby("comparison")["value"].mean()).round(2).to_dict(),
    }


def like_sized(scores: Mapping[Key, NeuronScores], like: Mapping[Key, NeuronSet]) -> dict[Key, NeuronSet]:
    """The top ``len(like[k])`` neurons of each ``scores[k]`` (a set as large as the one it is compared with)."""
    return {k: scores[k].top_k(len(like[k])) for k in like if k in scores}


def neft_scores(
    ctx: Context, datasets: Mapping[Key, list[Example]], names: Mapping[Key, str], steps: int
) -> dict[Key, NeuronScores]:
    """NeFT's 1 - cos scores of every dataset (fine-tuned on all its examples), cached by ``ctx``."""
    return {k: ctx.localize("neft", names[k], ex, steps=steps, lr=NEFT["lr"]) for k, ex in datasets.items()}


@experiment("specificity", TITLE)
def run(ctx: Context) -> ExperimentResult:
    """The registered experiment: cohesion and separability of each operator's neurons."""
    from capinterp.units.metrics import overlap_matrix

    sigma = 6.0
    conds = {c: CONDITIONS[c] for c in (QUICK_CONDITIONS if ctx.quick else CONDITIONS)}
    pairs = QUICK_PAIRS if ctx.quick else PAIRS
    pools = {} if ctx.quick else POOLS
    n = ctx.size(6, 50)
    data, names = build_datasets(conds, n, ctx.seed)
    scores = locate_all(data, context_scorer(ctx), names)
    scores.update(pool_scores(scores, pools))
    sets = {k: s.select(sigma=sigma) for k, s in scores.items()}
    neft_conds = QUICK_NEFT_CONDITIONS if ctx.quick else list(conds)
    neft_data = {k: ex for k, ex in data.items() if k[1] in neft_conds}
    neft_steps = ctx.size(1, NEFT["steps"])
    neft = neft_scores(ctx, neft_data, names, neft_steps)
    neft.update(pool_scores(neft, pools))
    neft_sets = like_sized(neft, sets)
    table = pd.concat(
        [compare_sets(sets, pairs).assign(method="dcsn"), compare_sets(neft_sets, pairs).assign(method="neft")],
        ignore_index=True,
    )
    table = table[["method", *[c for c in table.columns if c != "method"]]]
    ordered = {f"{op} {c}": sets[(op, c)] for op in OPS for c in conds if (op, c) in sets}
    fig = overlap_matrix(
        ordered,
        metric="cohesion",
        title=f"|A∩B|/max(|A|,|B|) of DCSN operator neurons (sigma={sigma:g}, n={n} per set)",
    )
    per_layer = torch.stack([s.per_layer() for s in sets.values()]).sum(0).tolist()
    info = {
        "paper": PAPER,
        "measured": summarize(table[table.method == "dcsn"]),
        "measured_neft": summarize(table[table.method == "neft"]),
        "neft": {
            "steps": neft_steps,
            "lr": NEFT["lr"],
            "optimizer": "sgd",
            "size": "as DCSN's set",
            "conditions": neft_conds,
        },
        "set_sizes": {f"{op} {c}": len(s) for (op, c), s in sets.items()},
        "examples_used": {f"{op} {c}": int(s.meta.get("n_samples", 0)) for (op, c), s in scores.items()},
        "located_per_layer_all_sets": per_layer,
        "share_in_layer_0": round(per_layer[0] / max(1, sum(per_layer)), 3),
        "sigma": sigma,
        "n_per_set": n,
        "seed": ctx.seed,
        "notes": (
            "value = |A∩B|/max(|A|,|B|) (Coh for one operator, Sep for two); iou and overlap beside it. "
            "Kinds: format (DG/MQ/TF, en), language (en vs zh, same expressions), resample "
            "(same condition, seed+1: the sampling-noise ceiling of cohesion). Localized on "
            "examples whose greedy first token is right; MQ/TF are near chance for small models. "
            "method=neft rows: NeFT (a short full SGD fine-tune on all the dataset's examples, the "
            "neurons whose weights turned most), as many neurons as the DCSN set of the same key."
        ),
    }
    neurons = {f"{OP_NAMES[op]}_{c}": s for (op, c), s in sets.items()}
    neurons.update({f"neft_{OP_NAMES[op]}_{c}": s for (op, c), s in neft_sets.items()})
    return ExperimentResult("specificity", TITLE, table, fig, info, neurons)
