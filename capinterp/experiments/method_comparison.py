"""Four localizers, one model, one protocol (Huang et al. 2025, Table 4): overlap, parameter share, IPP.

Rows KN, ROME, KC and CNL; columns as in the paper:

* **overlap** (fidelity, %): KN / ROME / KC -- mean pairwise overlap of the units located on
  paraphrases of one fact, as the fidelity experiment computes it
  (:func:`capinterp.experiments.fidelity.locate_paraphrases`, builtin paraphrase bags the model
  answers); CNL -- split-half overlap of the capability neurons
  (:func:`capinterp.experiments.commonality.commonality_table`);
* **neuron_pct**: the share of the model's parameters the located units own (``param_share``:
  KN's per-prompt neurons, ROME's traced MLP layers, KC's circuit nodes, CNL's neurons), mean
  over prompts / facts / halves;
* **ipp** (percentage points): manipulate the located units, compare with ``n_random`` random
  equal-size draws, IPP = drop(located) - max_r drop(random_r) (:func:`capinterp.units.metrics.ipp`,
  positive when the located units hurt more than every draw). Per method: KN -- zero the
  prompt's neurons at its last token, target probability; ROME -- zero the traced layers' MLP
  output at every position, target probability; KC -- remove the circuit's edges (the rest of
  the graph runs), circuit-complement Hit@10; CNL -- zero the neurons at every position,
  held-out task metric (:func:`capinterp.experiments.erase.erase_table`, sigma 6).

Paper (GPT-J): KN 37.3 / 0.2 / 11.4, ROME 32.7 / 16.7 / 0.0, KC 7.2 / 1.6 / 10.5, CNL 96.4 / 0.2 / 20.0.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any, cast

import numpy as np
import pandas as pd
import torch

from capinterp.arch.forward import logits_at
from capinterp.core.example import Example
from capinterp.core.protocol import Model
from capinterp.core.tokens import encode
from capinterp.data.paraphrases import builtin_paraphrases, known_paraphrases
from capinterp.experiments import capability_data as cd
from capinterp.experiments import fidelity as F
from capinterp.experiments import reliability as R
from capinterp.experiments._per_sample import ScoreCache
from capinterp.experiments.base import Context, ExperimentResult, experiment
from capinterp.experiments.commonality import commonality_table
from capinterp.experiments.erase import PAPER_TABLE4, erase_table
from capinterp.kernels.tracing import trace_hook
from capinterp.plots.paper import measured_vs_paper
from capinterp.units import metrics
from capinterp.units.neurons import NeuronSet

__all__ = ["COLUMNS", "METHODS", "kc_ipp", "rome_ipp", "run", "table4"]

NAME, TITLE = "method_comparison", "Four localizers side by side (Huang et al. 2025, Table 4)"
METHODS = ("KN", "ROME", "KC", "CNL")
COLUMNS = [
    "method",
    "unit",
    "overlap",
    "overlap_chance",
    "neuron_pct",
    "ipp",
    "ipp_metric",
    "n",
    "paper_overlap",
    "paper_neuron_pct",
    "paper_ipp",
]


@torch.no_grad()
def _prob(model: Model, ex: Example, hooks: list | None = None) -> float:
    """p(first target token | prompt) under ``hooks``."""
    enc = encode(model, [ex], max_target_tokens=1)[0]
    tokens = torch.tensor([enc.prompt_ids], device=model.cfg.device)
    logits = logits_at(
        model, tokens, torch.tensor([len(enc.prompt_ids) - 1], device=model.cfg.device), fwd_hooks=hooks or []
    )
    return float(torch.softmax(logits[0].double(), -1)[enc.target_ids[0]])


def _zero_mlp(model: Model, layers: Sequence[int]) -> list:
    return [(trace_hook(model, "mlp", int(l)), lambda act, hook: torch.zeros_like(act)) for l in layers]


def rome_ipp(model: Model, ex: Example, layers: Sequence[int], n_random: int, seed: int = 0) -> float:
    """Zero the MLP output of ``layers`` (every position) vs ``n_random`` random equal-size layer
    sets: IPP of the drop in target probability (a fraction)."""
    n_layers = int(model.cfg.n_layers)
    before = _prob(model, ex)
    located = before - _prob(model, ex, _zero_mlp(model, layers))
    rng = random.Random(f"capinterp-rome-ipp|{seed}")
    rand = [
        before - _prob(model, ex, _zero_mlp(model, rng.sample(range(n_layers), len(layers)))) for _ in range(n_random)
    ]
    return metrics.ipp(located, rand)


def kc_ipp(model: Model, circuit: Any, facts: Sequence[Example], n_random: int, seed: int = 0) -> float:
    """Remove the circuit's edges vs ``n_random`` random equal-size edge sets: IPP of the drop in
    circuit-complement Hit@10 (a fraction)."""
    from capinterp.circuits.graph import Circuit
    from capinterp.circuits.hit import hit_at_k

    graph = circuit.graph
    full = hit_at_k(model, Circuit.full(graph), list(facts), 10)["hit@10"]

    def without(mask: torch.Tensor) -> float:
        return hit_at_k(model, Circuit(graph, graph.edge_mask & ~mask), list(facts), 10)["hit@10"]

    located = full - without(circuit.mask)
    edges = graph.edge_mask.flatten().nonzero().flatten()
    gen = torch.Generator().manual_seed(seed)
    rand = []
    for _ in range(n_random):
        pick = edges[torch.randperm(len(edges), generator=gen)[: int(circuit.mask.sum())]]
        mask = torch.zeros(graph.edge_mask.numel(), dtype=torch.bool)
        mask[pick] = True
        rand.append(full - without(mask.view_as(graph.edge_mask)))
    return metrics.ipp(located, rand)


def _fact_rows(
    model: Model,
    bags: Sequence[Sequence[Example]],
    *,
    kn_steps: int,
    kn_rule: str,
    ct_samples: int,
    kc_top_n: int,
    n_random: int,
    seed: int,
    cache: ScoreCache | None,
) -> list[dict[str, Any]]:
    """KN, ROME and KC rows: fidelity overlap, parameter share and IPP over the bags' prompts."""
    from capinterp.localizers.knowledge_circuit import KnowledgeCircuit

    kn = [F.locate_paraphrases(model, bag, "kn", kn_steps=kn_steps, kn_rule=kn_rule, cache=cache) for bag in bags]
    rome = [F.locate_paraphrases(model, bag, "rome", ct_samples=ct_samples) for bag in bags]
    kc = [
        [KnowledgeCircuit(model, algorithm="eap", top_n=kc_top_n, progress=False).fit([e]) for e in bag] for bag in bags
    ]

    def overlap(per_bag: list[list[Any]], key: str = "mean_overlap") -> float:
        vals = [F._pair_stats([s for s in sets if s is not None])[key] for sets in per_bag]
        return 100 * float(np.nanmean(vals)) if vals else np.nan

    exs = [e for bag in bags for e in bag]
    kn_sets = [cast(NeuronSet, s) for sets in kn for s in sets]  # KN locates a NeuronSet per prompt
    frame = R.reliability_frame(model, exs, neuron_sets=kn_sets, factors=(0.0,), n_random=n_random, seed=seed)
    kn_ipp = []
    for _, g in frame[frame["n_neurons"] > 0].groupby("sample"):
        drop = g["p_before"] - g["p_after"]
        kn_ipp.append(metrics.ipp(float(drop[g["arm"] == "located"].iloc[0]), list(drop[g["arm"] == "random"])))
    traced = [(e, s) for bag, sets in zip(bags, rome) for e, s in zip(bag, sets) if s is not None]
    fits = [(e, f) for bag, row in zip(bags, kc) for e, f in zip(bag, row)]
    mean = lambda xs: 100 * float(np.mean(xs)) if len(xs) else np.nan  # noqa: E731
    return [
        {
            "method": "KN",
            "unit": "neuron",
            "overlap": overlap(kn),
            "overlap_chance": overlap(kn, "mean_overlap_chance"),
            "neuron_pct": mean([s.param_share for s in kn_sets]),
            "ipp": mean(kn_ipp),
            "ipp_metric": "target prob (pp)",
            "n": len(exs),
        },
        {
            "method": "ROME",
            "unit": "layer",
            "overlap": overlap(rome),
            "overlap_chance": overlap(rome, "mean_overlap_chance"),
            "neuron_pct": mean([s.param_share for _, s in traced]),
            "ipp": mean([rome_ipp(model, e, sorted(s.keys()), n_random, seed) for e, s in traced]),
            "ipp_metric": "target prob (pp)",
            "n": len(traced),
        },
        {
            "method": "KC",
            "unit": "edge",
            "overlap": overlap([[f.units_ for f in row] for row in kc]),
            "overlap_chance": overlap([[f.units_ for f in row] for row in kc], "mean_overlap_chance"),
            "neuron_pct": mean([f.units_.param_share for _, f in fits]),
            "ipp": mean([kc_ipp(model, f.circuit_, [e], n_random, seed) for e, f in fits]),
            "ipp_metric": "Hit@10 (pp)",
            "n": len(fits),
        },
    ]


def table4(
    model: Model,
    bags: Sequence[Sequence[Example]],
    capability: cd.CapabilityData,
    *,
    localize: cd.Localize | None = None,
    cnl_params: dict | None = None,
    kn_steps: int = 20,
    kn_rule: str = "right",
    ct_samples: int = 10,
    kc_top_n: int = 100,
    n_random: int = 5,
    seed: int = 0,
    cache: ScoreCache | None = None,
) -> pd.DataFrame:
    """The Table 4 frame: one row per method (see the module docstring), the paper's numbers beside."""
    rows = _fact_rows(
        model,
        bags,
        kn_steps=kn_steps,
        kn_rule=kn_rule,
        ct_samples=ct_samples,
        kc_top_n=kc_top_n,
        n_random=n_random,
        seed=seed,
        cache=cache,
    )
    params = {"cnl": dict(cnl_params or {})}
    localize = localize or cd.default_localize(model)
    common = commonality_table(
        model, {capability.name: capability.locate}, methods=("cnl",), params=params, seed=seed, localize=localize
    )
    scores = cd.located_scores(localize, "cnl", capability, seed, **params["cnl"])
    erased = erase_table(
        model,
        {capability.name: scores},
        {capability.name: capability.test},
        metrics_by_name={capability.name: capability.metric},
        sigmas=(6.0,),
        n_random=n_random,
        seed=seed,
    )
    rows.append(
        {
            "method": "CNL",
            "unit": "neuron",
            "overlap": 100 * float(common["overlap"].iloc[0]),
            "overlap_chance": 100 * float(common["overlap_chance"].iloc[0]),
            "neuron_pct": 100 * scores.select(sigma=6.0).param_share,
            "ipp": 100 * float(erased["ipp"].iloc[0]),
            "ipp_metric": f"{capability.metric} (pp)",
            "n": len(capability.locate),
        }
    )
    out = pd.DataFrame(rows)
    for col, key in (("paper_overlap", "overlap"), ("paper_neuron_pct", "neuron_pct"), ("paper_ipp", "ipp")):
        out[col] = [PAPER_TABLE4[m][key] for m in out["method"]]
    return out[COLUMNS]


@experiment(NAME, TITLE)
def run(ctx: Context) -> ExperimentResult:
    """KN / ROME / KC on builtin paraphrase bags, CNL on one capability; Table 4's three columns."""
    bags = known_paraphrases(
        ctx.model, builtin_paraphrases(3 if ctx.quick else None), per_fact=ctx.size(3, 4), max_facts=ctx.size(1, 4)
    )
    s = cd.settings(ctx)
    capability = cd.prepared(ctx, {**s, "capabilities": ("sub",)})["sub"]
    ig = ctx.ig(3, 10)
    table = table4(
        ctx.model,
        bags,
        capability,
        localize=ctx.localize,
        cnl_params=s["params"]["cnl"],
        kn_steps=ig["steps"],
        kn_rule=ig["rule"],
        ct_samples=ctx.size(1, 3),
        n_random=ctx.size(2, 5),
        seed=ctx.seed,
        cache=ctx.scores,
    )
    fig = measured_vs_paper(
        table["method"],
        table["ipp"],
        table["paper_ipp"],
        title="IPP per localizer (Table 4)",
        yaxis_title="IPP (percentage points)",
        xaxis_title="localizer",
    )
    info = {
        "paper_table4": PAPER_TABLE4,
        "n_facts": len(bags),
        "capability": capability.name,
        "notes": (
            "overlap and neuron_pct in %, ipp in percentage points of the metric named in ipp_metric. "
            "KN/ROME/KC: the fidelity experiment's paraphrase bags; CNL: the 'sub' capability "
            "(split-half overlap; IPP from erasing the sigma-6 set on held-out examples). The paper used GPT-J."
        ),
    }
    return ExperimentResult(NAME, TITLE, table, fig, info)
