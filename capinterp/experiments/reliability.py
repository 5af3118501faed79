"""Reliability of KN's validation (Huang et al. 2025, Sec. 3.2; Dai et al. 2022's suppress / amplify test).

KN validates knowledge neurons by doubling or zeroing them and watching the answer's probability.
The CNL paper repeats this with an equal-size random neuron set and finds that random neurons
move the probability in the same direction almost as often. Here every prompt the model answers
(builtin paraphrase bags) gets its own KN set (:mod:`capinterp.experiments._per_sample`); the
activations are multiplied by 2 (amplify) or 0 (erase), once for the located set and once for each
of ``n_random`` random sets of the same size (``NeuronSet.random_like(seed + 1000 * r + i)`` for
prompt ``i`` and draw ``r``), and we count the prompts whose target probability rises or falls.

Intervention site: ``position="last"`` (default) scales the neurons at the last prompt token
only, KN's convention (Dai et al. scale the [MASK] position); ``position="all"`` scales them at
every position with :func:`capinterp.scale` (the CNL erase convention). Prompts whose KN set is
empty are left out of the shares (nothing to intervene on) and counted in ``n_empty``.

Paper (GPT-J, zsRE): x2 located 85.1 % up / 14.9 % down, random 72.3 / 27.7;
x0 located 27.4 % up / 72.4 % down, random 17.6 / 82.6; 15.3 KNs per sample.

**Parameter chains** (Sec. 3.2, the knowledge-circuit view of the same facts,
:func:`parameter_chains`): one knowledge circuit per fact (EAP on its paraphrases, the top
``kc_top_n`` edges, dead nodes pruned), then recall through the circuit alone -- circuit-only
Hit@1 / Hit@10 of the target (:func:`capinterp.circuits.hit.hit_at_k`), with every other edge
zero-ablated (KC's convention) and, beside it, replaced by its corrupted-run value (the EAP
library's convention) -- and the share of the model's parameters the circuit's nodes own.
Paper: Hit@1 12.3 %, 2.6 % of the parameters.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import torch

from capinterp.arch.forward import logits_at
from capinterp.core.example import Example
from capinterp.core.protocol import Model
from capinterp.core.tokens import encode
from capinterp.data.paraphrases import builtin_paraphrases, known_paraphrases
from capinterp.experiments._per_sample import ScoreCache, kn_neurons, kn_scores
from capinterp.experiments.base import Context, ExperimentResult, experiment
from capinterp.interventions.hooks import neuron_hooks, scale
from capinterp.units.neurons import NeuronSet

__all__ = [
    "PAPER",
    "PAPER_CHAINS",
    "POSITIONS",
    "parameter_chains",
    "reliability_frame",
    "run",
    "summarize",
    "target_prob",
]

POSITIONS = ("last", "all")
OPERATIONS = {2.0: "amplify x2", 0.0: "erase x0"}
COLUMNS = ["sample", "fact", "n_neurons", "factor", "operation", "arm", "draw", "seed", "p_before", "p_after"]
SUMMARY_COLUMNS = ["operation", "arm", "n", "share_up", "share_down", "rel_change", "paper_up", "paper_down"]
# (operation, arm) -> (% samples up, % samples down), Huang et al. 2025, Sec. 3.2 (GPT-J, zsRE)
PAPER = {
    ("amplify x2", "located"): (85.1, 14.9),
    ("amplify x2", "random"): (72.3, 27.7),
    ("erase x0", "located"): (27.4, 72.4),
    ("erase x0", "random"): (17.6, 82.6),
}

#: Huang et al. 2025, Sec. 3.2: circuit-only Hit@1 (%) and the circuit's share of parameters (%).
PAPER_CHAINS = {"hit@1": 12.3, "param_share_pct": 2.6}
CHAIN_COLUMNS = [
    "fact",
    "n_prompts",
    "n_edges",
    "param_share",
    "hit@1_zero",
    "hit@10_zero",
    "hit@1_corrupt",
    "hit@10_corrupt",
    "full_hit@1",
]


def parameter_chains(model: Model, bags: Sequence[Sequence[Example]], *, kc_top_n: int = 100) -> pd.DataFrame:
    """One row per fact: its EAP circuit's size, parameter share and circuit-only Hit@k.

    ``bags``: one list of paraphrased Examples per fact (``meta["subject"]`` set). Hit@k under
    zero ablation (KC / CNL) and corrupted-run ablation (EAP), and the unablated model's Hit@1.
    """
    from capinterp.circuits.hit import hit_at_k
    from capinterp.localizers.knowledge_circuit import KnowledgeCircuit

    rows = []
    for i, bag in enumerate(bags):
        kc = KnowledgeCircuit(model, algorithm="eap", top_n=kc_top_n, progress=False).fit(list(bag))
        zero = hit_at_k(model, kc.circuit_, list(bag), (1, 10), ablation="zero", full=True)
        corrupt = hit_at_k(model, kc.circuit_, list(bag), (1, 10), ablation="corrupt")
        rows.append(
            {
                "fact": bag[0].meta.get("fact_id", i),
                "n_prompts": len(bag),
                "n_edges": len(kc.units_),
                "param_share": kc.units_.param_share,
                "hit@1_zero": zero["hit@1"],
                "hit@10_zero": zero["hit@10"],
                "hit@1_corrupt": corrupt["hit@1"],
                "hit@10_corrupt": corrupt["hit@10"],
                "full_hit@1": zero["full_hit@1"],
            }
        )
    return pd.DataFrame(rows, columns=CHAIN_COLUMNS)


def _last_only(hooks: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """Apply each hook to the last position only (batch of one unpadded prompt)."""

    def wrap(fn: Any) -> Any:
        def hook(act: torch.Tensor, hook: Any) -> torch.Tensor:
            act = act.clone()
            act[:, -1:] = fn(act[:, -1:], hook)
            return act

        return hook

    return [(name, wrap(fn)) for name, fn in hooks]


@torch.no_grad()
def target_prob(
    model: Model, ex: Example, neurons: NeuronSet | None = None, factor: float = 1.0, position: str = "last"
) -> float:
    """p(first target token | prompt), with ``neurons`` scaled by ``factor`` at ``position``."""
    if position not in POSITIONS:
        raise ValueError(f"position must be one of {POSITIONS}, got {position!r}")
    enc = encode(model, [ex], max_target_tokens=1)[0]
    tokens = torch.tensor([enc.prompt_ids], device=model.cfg.device)
    pos = torch.tensor([len(enc.prompt_ids) - 1], device=model.cfg.device)
    if neurons is None:
        logits = logits_at(model, tokens, pos)
    elif position == "last":
        logits = logits_at(model, tokens, pos, fwd_hooks=_last_only(neuron_hooks(model, neurons, float(factor))))
    else:
        with scale(model, neurons, factor):
            logits = logits_at(model, tokens, pos)
    return float(torch.softmax(logits[0].double(), -1)[enc.target_ids[0]])


def reliability_frame(
    model: Model,
    examples: Sequence[Example],
    *,
    neuron_sets: Sequence[NeuronSet] | None = None,
    kn_steps: int = 20,
    kn_rule: str = "right",
    kn_threshold: float = 0.2,
    factors: Sequence[float] = (2.0, 0.0),
    n_random: int = 3,
    seed: int = 0,
    position: str = "last",
    cache: ScoreCache | None = None,
) -> pd.DataFrame:
    """One row per (prompt, factor, arm, draw): target probability before and after.

    ``neuron_sets`` (one per example) replaces KN localization when given. Columns: sample,
    fact, n_neurons, factor, operation, arm ("located" / "random"), draw, seed, p_before, p_after.
    """
    if position not in POSITIONS:
        raise ValueError(f"position must be one of {POSITIONS}, got {position!r}")
    if neuron_sets is not None and len(neuron_sets) != len(examples):
        raise ValueError(f"got {len(neuron_sets)} neuron sets for {len(examples)} examples")
    rows = []
    for i, ex in enumerate(examples):
        ns = (
            neuron_sets[i]
            if neuron_sets is not None
            else kn_neurons(kn_scores(model, ex, steps=kn_steps, rule=kn_rule, cache=cache), kn_threshold)
        )
        before = target_prob(model, ex)
        arms = [("located", -1, None, ns)] + [
            ("random", r, seed + 1000 * r + i, ns.random_like(seed + 1000 * r + i)) for r in range(n_random)
        ]
        for factor in factors:
            for arm, draw, s, units in arms:
                rows.append(
                    {
                        "sample": i,
                        "fact": ex.meta.get("fact_id"),
                        "n_neurons": len(ns),
                        "factor": float(factor),
                        "operation": OPERATIONS.get(float(factor), f"scale x{factor:g}"),
                        "arm": arm,
                        "draw": draw,
                        "seed": s,
                        "p_before": before,
                        "p_after": target_prob(model, ex, units, factor, position),
                    }
                )
    return pd.DataFrame(rows, columns=COLUMNS)


def summarize(frame: pd.DataFrame) -> pd.DataFrame:
    """Per (operation, arm): % of samples whose probability rose / fell, over prompts with a non-empty set.

    Random draws count as separate samples. ``rel_change`` = (mean p_after - mean p_before) / mean
    p_before (Dai et al.'s aggregate).
    """
    rows = []
    for (op, arm), g in frame.groupby(["operation", "arm"], sort=False):
        g = g[g["n_neurons"] > 0]
        d = g["p_after"] - g["p_before"]
        n = len(g)
        up, down = PAPER.get((op, arm), (np.nan, np.nan))
        rows.append(
            {
                "operation": op,
                "arm": arm,
                "n": n,
                "share_up": round(100 * float((d > 0).mean()), 1) if n else np.nan,
                "share_down": round(100 * float((d < 0).mean()), 1) if n else np.nan,
                "rel_change": float(g["p_after"].mean() / g["p_before"].mean() - 1) if n else np.nan,
                "paper_up": up,
                "paper_down": down,
            }
        )
    return pd.DataFrame(rows, columns=SUMMARY_COLUMNS)


def _figure(summary: pd.DataFrame) -> go.Figure:
    x = summary["operation"] + " / " + summary["arm"]
    fig = go.Figure(
        [
            go.Bar(name="measured % up", x=x, y=summary["share_up"]),
            go.Bar(name="paper % up (GPT-J)", x=x, y=summary["paper_up"]),
        ]
    )
    fig.update_layout(
        barmode="group",
        title="Reliability: share of prompts whose target probability rises",
        yaxis_title="% of prompts",
    )
    return fig


@experiment(
    "reliability",
    "Reliability: located vs random neurons under KN's amplify / erase test (Huang et al. 2025, Sec. 3.2)",
)
def run(ctx: Context) -> ExperimentResult:
    """Per-prompt KN sets on builtin paraphrases the model answers; x2 and x0 vs 3 random sets."""
    candidates = builtin_paraphrases(3 if ctx.quick else None)
    bags = known_paraphrases(ctx.model, candidates, per_fact=ctx.size(3, 4), max_facts=ctx.size(1, 8))
    examples = [e for bag in bags for e in bag]
    ig, n_random = ctx.ig(3, 10), ctx.size(2, 3)
    kn_steps = ig["steps"]
    frame = reliability_frame(
        ctx.model,
        examples,
        kn_steps=kn_steps,
        kn_rule=ig["rule"],
        n_random=n_random,
        seed=ctx.seed,
        position="last",
        cache=ctx.scores,
    )
    table = summarize(frame)
    chains = parameter_chains(ctx.model, bags, kc_top_n=100)
    sizes = frame.drop_duplicates("sample")["n_neurons"]
    info = {
        "paper": {f"{op} / {arm}": {"up": u, "down": d} for (op, arm), (u, d) in PAPER.items()},
        "n_samples": len(examples),
        "n_empty": int((sizes == 0).sum()),
        "mean_neurons": float(sizes.mean()) if len(sizes) else None,
        "paper_mean_neurons": 15.3,
        "kn_steps": kn_steps,
        "kn_rule": ig["rule"],
        "n_random": n_random,
        "position": "last",
        "parameter_chains": {
            "paper": PAPER_CHAINS,
            "mean_pct": {k: round(100 * float(chains[k].mean()), 2) for k in CHAIN_COLUMNS[3:]},
            "mean_edges": float(chains["n_edges"].mean()),
            "per_fact": chains.to_dict("records"),
            "kc_top_n": 100,
        },
        "notes": (
            "Per-prompt KN coarse sets (IG at the last prompt token, > 0.2 x max), scaled at the last "
            "prompt token only (KN's convention). Random arms: equal-size sets, seed + 1000*draw + "
            "sample. The paper used GPT-J on zsRE. parameter_chains: one EAP circuit (top 100 edges) "
            "per fact; circuit-only Hit@k with the rest zero-ablated (KC) or corrupted (EAP); "
            "param_share = parameters of the circuit's nodes / all parameters."
        ),
    }
    return ExperimentResult(
        "reliability", "Reliability of KN's amplify / erase validation", table, _figure(table), info
    )
