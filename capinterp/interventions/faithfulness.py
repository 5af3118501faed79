"""How good is a localization? Faithfulness curves against chance (MIB's CPR and CMD).

For a ranking of units (neurons, or whole layers' neurons) and a size k, two runs of the data:

* **kept**: only the top-k units run; every other unit is ablated;
* **ablated**: the top-k units are ablated; every other unit runs.

Units are neurons, layers (all of a layer's neurons), experts of a mixture-of-experts model (all of
an expert's neurons, :mod:`capinterp.units.experts`) or circuit edges; an edge's ablation replaces
its source node's contribution to the downstream node's input
(:mod:`capinterp.interventions.edge_faithfulness`). Ablating an expert is what ``ci.erase`` does to
an expert KeySet: its neurons take their ablated values and the routing is kept, so zero ablation
zeroes its output on the tokens routed to it, and mean ablation writes there its mean output over
the reference tokens routed to it (on MoE models every expert neuron's mean is over the tokens its
expert takes part in; an expert's neurons written on a token not routed to it would have no effect;
a mixed dense / MoE model's dense layers hold no experts: they are no expert units and always run). A unit's ablated value is its mean activation
over reference data (``ablation="mean"``, the
default; the data itself unless ``reference=`` is given; first positions averaged apart from the
rest, see :mod:`capinterp.core.position_mean`), zero (``"zero"``), or its activation on
the example's corrupted prompt at the same position (``"corrupt"``: subject swaps from
:func:`capinterp.circuits.eap.make_pairs`, or ``corrupt=`` a callable). Ablation applies at every
position, as :func:`capinterp.interventions.hooks.erase` does.

With ``m`` the metric averaged over the data (``"prob"``: p(target's first token), ``"logprob"``,
or ``"logit_diff"``: logit(target) - logit(corrupted answer)), ``m(N)`` the full model and
``m(∅)`` everything ablated, the faithfulness of a kept set C is (Mueller et al. 2025, MIB)

    f(C) = (m(C) - m(∅)) / (m(N) - m(∅)),

and over the sizes k_1 < ... < k_n, as fractions x = k / n_units with f = 0 at x = 0 and f = 1 at
x = 1 (both measured, not assumed), trapezoid areas give

    CPR = ∫ f(x) dx   (higher is better),      CMD = ∫ |1 - f(x)| dx   (lower is better).

Necessity beside sufficiency: with ``g(k)`` the same normalization of the ablated run (the top-k
ablated, every other unit running; ``g = 1`` at k = 0, ``g = 0`` with every unit ablated),

    ablated_area = ∫ (1 - g(x)) dx   (higher = more necessary),

the share of the behaviour lost when the top-k are removed, averaged over sizes
(:mod:`capinterp.interventions.faithfulness_stats`). A set can be necessary but not sufficient
(a high ablated area, a CPR at chance) or the reverse.

The random band: ``random_sets`` uniformly random unit sets of each size (seeded), run the same
way; the table gives their mean and 5th / 95th percentiles, and ``random_cpr`` / ``random_cmd`` /
``random_ablated_area`` the same statistics of the areas (draw r at every size is one random curve).
The random sets do not depend on the ranking: a call's ``.band`` (the full model, everything
ablated and the random sets, per example) can be passed to the next call on the same units, data
and settings (``band=``), which then runs only its own top-k sets.
Confidence intervals (``cpr_ci``, ``cmd_ci``, ``ablated_area_ci``): percentile bootstrap over the
examples (``bootstrap`` resamples, seeded), from the per-example values of the same runs.
All configurations of one call are rows of the same batched forward passes.
On a model whose layers differ in width (dense layers between MoE layers) the neuron units are its
real neurons only: the padding of the narrower layers (always 0) is never ranked, drawn or counted
in ``n_units``, and runs in every configuration; its dense layers are no expert units and always run.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import pandas as pd
import torch

from capinterp.arch.family import family_of
from capinterp.arch.forward import logits_at
from capinterp.arch.model import model_fingerprint, neuron_hook, neuron_shape, valid_neurons
from capinterp.core import distributed as dist
from capinterp.core import validate
from capinterp.core.position_mean import SplitMean, at_positions
from capinterp.core.protocol import Model
from capinterp.core.tokens import Encoded, batches, encode, pad_id, pad_right
from capinterp.interventions.edge_faithfulness import edge_metric, edge_ranking, is_edge_input
from capinterp.interventions.faithfulness_metric import corrupt_pairs, metric_rows
from capinterp.interventions.faithfulness_stats import areas, bootstrap_areas, curve_grid
from capinterp.interventions.faithfulness_stats import band as spread
from capinterp.interventions.resumable_rows import resumable_rows, tag_of
from capinterp.localizers.base import Localizer
from capinterp.units.base import KeySet
from capinterp.units.experts import (
    dense_layers,
    expert_columns,
    expert_index,
    expert_keys,
    expert_units,
    moe_of,
)
from capinterp.units.neurons import NeuronScores, NeuronSet

__all__ = [
    "ABLATIONS",
    "DEFAULT_FRACTIONS",
    "FAITHFULNESS_METRICS",
    "MIB_FRACTIONS",
    "Faithfulness",
    "RandomBand",
    "ablated_metric",
    "faithfulness",
    "neuron_means",
]

ABLATIONS = ("mean", "zero", "corrupt")
FAITHFULNESS_METRICS = ("prob", "logprob", "logit_diff")
#: MIB's circuit sizes, as fractions of all units.
MIB_FRACTIONS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
#: The default sizes: MIB's, and 75 % and 90 %. MIB's grid has no point between 50 % and the whole
#: model, and on small models keeping half of the FFN neurons (the rest mean-ablated) can leave
#: p(target) at the fully ablated level whatever the ranking (SmolLM2's known facts): the area then
#: comes from that one segment alone and every ranking, random ones included, gets the same CPR.
DEFAULT_FRACTIONS = (*MIB_FRACTIONS[:-1], 0.75, 0.9, 1.0)


_NAN3 = (float("nan"),) * 3


@dataclass(frozen=True)
class RandomBand:
    """The runs every ranking of the same units on the same data shares: per example, the metric of
    the full model, of everything ablated, and of each random set of each size kept and ablated
    (``values``: ``[2 + 2 * n_sizes * random_sets, n_examples]``). ``key`` names what they were made
    for (unit kind and count, sizes, draws, seed, ablation, metric, data); pass a result's ``.band``
    to the next :func:`faithfulness` call (``band=``) to reuse them."""

    key: tuple
    values: np.ndarray


@dataclass
class Faithfulness:
    """Faithfulness curves of one ranking of units; see the module docstring."""

    table: pd.DataFrame
    full: float
    empty: float
    cpr: float
    cmd: float
    random_cpr: tuple[float, float, float]  # mean, 5th, 95th percentile over random curves
    random_cmd: tuple[float, float, float]
    meta: dict[str, Any] = field(default_factory=dict)
    ablated_area: float = float("nan")  # necessity: ∫ (1 - g) dx, higher = more necessary
    random_ablated_area: tuple[float, float, float] = _NAN3
    cpr_ci: tuple[float, float] = _NAN3[:2]  # bootstrap percentile interval over examples
    cmd_ci: tuple[float, float] = _NAN3[:2]
    ablated_area_ci: tuple[float, float] = _NAN3[:2]
    band: RandomBand | None = None

    def summary(self) -> str:
        rc, rd, ra = self.random_cpr, self.random_cmd, self.random_ablated_area

        def one(name: str, v: float, ci: tuple[float, float], r: tuple[float, float, float]) -> str:
            return f"{name} {v:.3f} [{ci[0]:.3f}, {ci[1]:.3f}] (random {r[0]:.3f}, 90% {r[1]:.3f}-{r[2]:.3f})"

        return (
            f"{self.meta.get('unit', 'unit')} faithfulness ({self.meta.get('metric')}, {self.meta.get('ablation')} "
            f"ablation, n={self.meta.get('n_examples')}): {one('CPR', self.cpr, self.cpr_ci, rc)}, "
            f"{one('CMD', self.cmd, self.cmd_ci, rd)}, {one('ablated area', self.ablated_area, self.ablated_area_ci, ra)}; "
            f"full model {self.full:.4g}, all ablated {self.empty:.4g}"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "cpr": self.cpr,
            "cmd": self.cmd,
            "ablated_area": self.ablated_area,
            "cpr_ci": list(self.cpr_ci),
            "cmd_ci": list(self.cmd_ci),
            "ablated_area_ci": list(self.ablated_area_ci),
            "random_cpr": list(self.random_cpr),
            "random_cmd": list(self.random_cmd),
            "random_ablated_area": list(self.random_ablated_area),
            "full": self.full,
            "empty": self.empty,
            "meta": self.meta,
        }

    def plot(self, title: str | None = None):
        """Plotly figure: faithfulness of the kept top-k against k, random band shaded."""
        from capinterp.plots.faithfulness import faithfulness_curve

        return faithfulness_curve(self.table, title or self.summary())


def _order(scores: torch.Tensor, by: str) -> torch.Tensor:
    return torch.sort(scores.abs() if by == "abs" else scores, descending=True, stable=True).indices


def _real_neurons(model: Model) -> torch.Tensor:
    """Flat indices of the model's real neurons into ``[n_layers * d_mlp]`` (every index but on
    models whose layers differ in width, whose padding neurons are no units): neuron unit ``u`` of
    the faithfulness space is flat neuron ``_real_neurons(model)[u]``."""
    return valid_neurons(model).flatten().nonzero().flatten()


def _ranking(model: Model, units: Any, by: str = "score") -> tuple[str, torch.Tensor, int | None]:
    """(unit kind, unit order best first, size of a given set or None for a full ranking); neuron
    units are numbered over the model's real neurons (:func:`_real_neurons`)."""
    if isinstance(units, Localizer):  # a fitted localizer: its neuron scores where it has them, else its units
        scores = getattr(units, "scores_", None)
        units = scores if isinstance(scores, NeuronScores) else getattr(units, "units_", units)
    L = neuron_shape(model)[0]
    if isinstance(units, NeuronScores):
        units.check_model(model)
        return "neuron", _order(units.scores.flatten()[_real_neurons(model)], by), None
    if isinstance(units, NeuronSet):
        units.check_model(model)
        real = _real_neurons(model)
        if int(units.mask.flatten()[real].sum()) != len(units):
            raise ValueError("the NeuronSet holds padding neurons of this model (past a dense layer's own width)")
        return "neuron", units.mask.flatten()[real].nonzero().flatten(), len(units)
    if isinstance(units, KeySet) and units.kind == "expert":
        idx = torch.searchsorted(expert_units(model), expert_index(model, units))  # positions among the experts
        return "expert", idx, len(idx)
    if _expert_score_shape(model, units):  # a mixed model's dense layers' rows hold no expert: not ranked
        return "expert", _order(torch.as_tensor(units, dtype=torch.float64).flatten()[expert_units(model)], by), None
    if isinstance(units, KeySet) and units.kind == "layer":
        layers = sorted(int(cast(int, k)) for k in units)
        if units.n_units not in (None, L) or any(not 0 <= k < L for k in layers):
            raise ValueError(f"the layer set {layers} (of {units.n_units} layers) does not fit this model's {L} layers")
        return "layer", torch.tensor(layers, dtype=torch.long), len(layers)
    if isinstance(units, (torch.Tensor, np.ndarray)) and np.ndim(units) == 1:
        s = torch.as_tensor(units, dtype=torch.float64)
        if s.numel() != L:
            raise ValueError(f"per-layer scores need {L} values (one per layer), got {s.numel()}")
        return "layer", _order(s, by), None
    raise TypeError(
        "faithfulness takes NeuronScores, a NeuronSet, a layer KeySet, per-layer scores [n_layers], an expert "
        "KeySet or expert scores [n_layers, n_experts (+1 shared)] (capinterp.units.experts), or a fitted "
        "localizer with one of them, or circuit edges (a KnowledgeCircuit, Circuit, EdgeSet, or edge scores "
        f"[n_src, n_slots]); got {type(units).__name__}"
    )


def _expert_score_shape(model: Model, units: Any) -> bool:
    """Whether ``units`` are per-expert scores ``[n_layers, n_experts (+1 shared)]`` of this MoE model
    (never edge scores: a graph has more sources than the model has layers)."""
    fam_moe = family_of(model).moe
    if fam_moe is None or not isinstance(units, (torch.Tensor, np.ndarray)) or np.ndim(units) != 2:
        return False
    return tuple(units.shape) == (neuron_shape(model)[0], len(expert_keys(fam_moe)))


def _sizes(ks: Any, n_units: int, given: int | None) -> list[int]:
    if given is not None and ks is None:
        return [given] if given else []
    if ks is None:
        ks = DEFAULT_FRACTIONS
    out = set()
    for k in ks:
        if isinstance(k, float) and not isinstance(k, bool):
            frac = validate.finite_float("ks (fraction)", k, low=0.0, high=1.0, low_open=True)
            out.add(max(1, round(frac * n_units)))
        else:
            out.add(validate.integer("ks", k, low=1, high=n_units))
    if given is not None and max(out) > given:
        raise ValueError(f"ks go up to {max(out)} but the given set has only {given} units (pass scores to rank all)")
    return sorted(out)


def _references(model: Model, items: list[Encoded], ablation: str, reference: Any, corrupt: Any, T: int, bs: int):
    """The value each ablated neuron takes: ``[2, L, d]`` (mean / zero: first position, later
    positions; :mod:`capinterp.core.position_mean`) or ``[n, T, L, d]`` (corrupt)."""
    L, d = neuron_shape(model)
    dev = model.cfg.device
    if ablation == "zero":
        return torch.zeros(2, L, d, device=dev), None
    if ablation == "mean":
        ref_items = items if reference is None else encode(model, validate.examples(reference, "reference"))
        return neuron_means(model, ref_items, bs), None
    pairs = corrupt_pairs(model, items, corrupt)
    acts = torch.zeros(len(items), T, L, d, device=dev)
    for s in range(0, len(pairs), bs):
        chunk = pairs[s : s + bs]
        tokens, _ = pad_right([p.corrupt_ids for p in chunk], pad_id(model.tokenizer))
        _, cache = model.run_with_cache(tokens.to(dev), names_filter=lambda n: n.endswith("mlp.hook_post"))
        for l in range(L):
            acts[s : s + len(chunk), : tokens.shape[1], l] = cache[neuron_hook(l)].float()
    return acts, pairs


def neuron_means(model: Model, items: list[Encoded], batch_size: int = 16) -> torch.Tensor:
    """``[2, L, d]``: every neuron's mean activation over the items' first positions and over their
    later positions (:mod:`capinterp.core.position_mean`: the first position is an attention sink);
    on a mixture-of-experts layer, over the tokens routed to the neuron's expert only."""
    L, _ = neuron_shape(model)
    moe = family_of(model).moe
    dense = dense_layers(model)  # a mixed model's dense layers: every neuron takes part in every token
    accs = [SplitMean() for _ in range(L)]
    for chunk in batches(items, batch_size):
        tokens, lengths = pad_right([it.ids for it in chunk], pad_id(model.tokenizer))
        _, cache = model.run_with_cache(tokens.to(model.cfg.device), names_filter=lambda n: n.endswith("mlp.hook_post"))
        for l, acc in enumerate(accs):
            act = cache[neuron_hook(l)]
            acc.add(act, lengths, None if moe is None or l in dense else _takes_part(act, moe))
    return torch.stack([acc.result() for acc in accs], 1)


def _takes_part(act: torch.Tensor, moe: Any) -> torch.Tensor:
    """``[batch, pos, d]`` bool: where an MoE layer's neuron takes part in the token: an expert's
    neurons where the router sent the token to it (some neuron of the expert is non-zero), the
    shared expert's always. A neuron's mean is over these tokens, so an expert's mean output is its
    mean when it runs, and ablating it writes that where it runs."""
    routed = moe.n_experts * moe.d_expert
    experts = act[..., :routed].unflatten(-1, (moe.n_experts, moe.d_expert)).ne(0).any(-1)
    return torch.cat(
        [experts.repeat_interleave(moe.d_expert, -1), torch.ones_like(act[..., routed:], dtype=torch.bool)], -1
    )


@torch.no_grad()
def _run(model: Model, keep: torch.Tensor, items, ref, ref_rows, pairs, metric: str, T: int, bs: int) -> torch.Tensor:
    """``[n_configs, n_examples]`` metric; ``keep`` is bool ``[n_configs, L, d]`` (True = the neuron runs).
    Under ``torchrun`` each rank runs every world_size-th batch and the ranks' values are summed (each
    (configuration, example) is measured by one rank, in the batch one process would use)."""
    L = keep.shape[1]
    dev = model.cfg.device
    dist.init(dev)
    ids = pad_right([it.ids for it in items], pad_id(model.tokenizer))[0]
    last = torch.tensor([it.last_prompt_pos for it in items])
    jobs = [(c, i) for c in range(keep.shape[0]) for i in range(len(items))]
    out = torch.zeros(keep.shape[0], len(items), dtype=torch.float64)
    keep = keep.to(dev)
    for chunk in dist.shard(list(batches(jobs, bs))):
        cfg = torch.tensor([c for c, _ in chunk], device=dev)
        ex = torch.tensor([i for _, i in chunk])

        def ablate(l: int):
            def hook(act: torch.Tensor, hook: Any) -> torch.Tensor:
                if ref_rows is None:
                    r = at_positions(ref, act.shape[1])[:, l]
                else:
                    r = ref_rows[ex.to(act.device), : act.shape[1], l]
                return torch.where(keep[cfg, l][:, None, :], act, r.to(act.dtype))

            return hook

        hooks = [(neuron_hook(l), ablate(l)) for l in range(L)]
        logits = logits_at(model, ids[ex].to(dev), last[ex].to(dev), fwd_hooks=hooks)
        vals = metric_rows(logits, ex.tolist(), items, pairs, metric).double().cpu()
        out[cfg.cpu(), ex] = vals
    return dist.all_reduce_sum(out, dev)


def ablated_metric(
    model: Model,
    data: Any,
    keep: torch.Tensor,
    *,
    ablation: str = "mean",
    metric: str = "prob",
    reference: Any = None,
    corrupt: Any = "auto",
    batch_size: int = 16,
    per_example: bool = False,
) -> np.ndarray:
    """``[n_configs]``: the metric averaged over ``data`` with every neuron outside ``keep`` (bool
    ``[n_configs, n_layers, d_mlp]``, True = runs) ablated; all configurations share the batches.
    ``data``: examples, or already encoded items. ``per_example``: ``[n_configs, n_examples]``, unaveraged."""
    ablation = validate.choice("ablation", ablation, ABLATIONS)
    metric = validate.choice("metric", metric, FAITHFULNESS_METRICS)
    bs = validate.positive_int("batch_size", batch_size)
    if keep.dim() != 3 or tuple(keep.shape[1:]) != neuron_shape(model):
        raise ValueError(
            f"keep must be [n_configs, {', '.join(map(str, neuron_shape(model)))}], got {tuple(keep.shape)}"
        )
    items = data if data and isinstance(data[0], Encoded) else encode(model, validate.examples(data, need_target=True))
    T = max(len(it.ids) for it in items)
    ref, pairs = _references(model, items, ablation, reference, corrupt, T, bs)
    ref_rows, ref = (ref, None) if ablation == "corrupt" else (None, ref)
    vals = _run(model, keep.bool(), items, ref, ref_rows, pairs, metric, T, bs).numpy()
    return vals if per_example else vals.mean(1)


@dataclass(frozen=True)
class _Units:
    """The ranked units of one :func:`faithfulness` call: their kind, order (best first), count, the
    size of a given set (None for a full ranking), the edge graph (edges only) and the ``by`` used."""

    kind: str
    order: torch.Tensor
    n_units: int
    given: int | None
    graph: Any
    by: str


def faithfulness(
    model: Model,
    units: Any,
    data: Any,
    *,
    ks: Sequence[int | float] | None = None,
    ablation: str = "mean",
    metric: str = "prob",
    reference: Any = None,
    corrupt: Any = "auto",
    by: str = "auto",
    random_sets: int = 20,
    seed: int = 0,
    batch_size: int = 16,
    band: RandomBand | None = None,
    bootstrap: int = 1000,
    confidence: float = 0.95,
    checkpoint: str | os.PathLike | None = None,
) -> Faithfulness:
    """Faithfulness of the top-k units of ``units`` on ``data``, beside random sets of each size.

    ``units``: NeuronScores (ranked by score), a NeuronSet, a layer KeySet or an expert KeySet
    (:func:`capinterp.units.experts.top_experts`; its own size, or ``ks`` up to it), per-layer
    scores ``[n_layers]``, per-expert scores ``[n_layers, n_experts (+1 shared)]``
    (:func:`capinterp.units.experts.expert_scores`; random sets are then random experts), or a
    fitted localizer; or circuit edges: a
    fitted KnowledgeCircuit or its Circuit (ranked by its edge scores; without scores, its kept
    edges as a set), an EdgeSet, or edge scores ``[n_src, n_slots]`` on the model's default graph
    (see :mod:`capinterp.interventions.edge_faithfulness` for what ablating an edge means). ``ks``: sizes as
    counts or fractions of all units (default :data:`DEFAULT_FRACTIONS`, MIB's and 0.75, 0.9; for a set, the set's size).
    ``by``: rank scores by their value (``"score"``, units that raise the metric first) or by
    ``"abs"`` (any strong effect first, as for CMD-style questions); ``"auto"`` (default): ``"abs"``
    for edges (as KnowledgeCircuit selects them), ``"score"`` otherwise.
    ``band``: another call's :attr:`Faithfulness.band` on the same units, data and settings (its
    random sets are reused, ValueError if it was made for others). ``bootstrap``: resamples of the
    examples for the percentile intervals at level ``confidence`` (0: none, the intervals are NaN).
    ``checkpoint``: a file where the random band's runs are saved chunk by chunk as they finish
    (:mod:`capinterp.interventions.resumable_rows`); a rerun with the same model, units, data and
    settings continues from it (another run's file is replaced).
    """
    ablation, metric, random_sets, bs, by = _check_faithfulness(model, ablation, metric, random_sets, batch_size, by)
    bootstrap = validate.nonneg_int("bootstrap", bootstrap)
    confidence = validate.finite_float("confidence", confidence, low=0.0, high=1.0, low_open=True, high_open=True)
    ranked = _ranked_units(model, units, by)
    sizes = _sizes(ks, ranked.n_units, ranked.given)
    items = encode(model, validate.examples(data, need_target=True))
    key = _band_key(model, ranked, sizes, random_sets, seed, (ablation, metric, reference, corrupt), items)
    if band is not None and band.key != key:
        raise ValueError("band= was made for other units, sizes, random_sets, seed, ablation, metric or data")
    located = _unit_masks(ranked, sizes, 0, seed)[2:]  # per size: the top-k kept, then ablated
    run = dict(ablation=ablation, metric=metric, reference=reference, corrupt=corrupt, batch_size=bs)

    def measure(masks: torch.Tensor) -> np.ndarray:
        if ranked.graph is not None:
            return edge_metric(model, ranked.graph, items, masks, per_example=True, **run)
        return ablated_metric(model, items, _neuron_keep(model, ranked.kind, masks), per_example=True, **run)

    if band is None and checkpoint is not None:  # the band chunk by chunk, saved as it goes
        rand = _unit_masks(ranked, sizes, random_sets, seed, False)
        tag = tag_of(model_fingerprint(model), key[1:-1], [(it.ids, it.last_prompt_pos) for it in items])
        band = RandomBand(key, resumable_rows(lambda a, b: measure(rand[a:b]), len(rand), checkpoint, tag))
    masks = located if band is not None else torch.cat([_unit_masks(ranked, sizes, random_sets, seed, False), located])
    vals = measure(masks) if len(masks) else np.zeros((0, len(items)))
    if band is None:
        band = RandomBand(key, vals[: -len(located)] if len(located) else vals)
        vals = vals[len(band.values) :]
    per_ex = np.concatenate([band.values[:2], vals])  # full, empty, per size: located kept, ablated
    meta = {"unit": ranked.kind, "n_units": ranked.n_units, "ablation": ablation, "metric": metric}
    meta.update({"n_examples": len(items), "random_sets": random_sets, "seed": int(seed), "ks": sizes, "by": ranked.by})
    meta.update({"bootstrap": bootstrap, "confidence": confidence})
    return _result(per_ex, band, sizes, ranked.n_units, random_sets, meta)


def _band_key(model: Model, ranked: _Units, sizes: list[int], random_sets: int, seed: int, run: tuple, items) -> tuple:
    """What a :class:`RandomBand` was made for: the model, the units (kind, count, graph), sizes,
    draws, seed, ablation settings and the encoded data."""
    ids = hash(tuple((tuple(it.ids), it.last_prompt_pos) for it in items))
    ablation, metric, reference, corrupt = run
    given = tuple(id(v) if v is not None and not isinstance(v, str) else v for v in (reference, corrupt))
    units = (ranked.kind, ranked.n_units, None if ranked.graph is None else id(ranked.graph))
    return (id(model), units, tuple(sizes), random_sets, int(seed), ablation, metric, given, ids)


def _result(
    per_ex: np.ndarray, band: RandomBand, sizes: list[int], n_units: int, random_sets: int, meta
) -> Faithfulness:
    """The curves' table, areas, random bands and bootstrap intervals from per-example values
    (``per_ex``: full, empty, per size the located set kept and ablated)."""
    means, rand = per_ex.mean(1), band.values[2:].mean(1).reshape(len(sizes), random_sets, 2)
    full, empty = float(means[0]), float(means[1])
    located = means[2:].reshape(len(sizes), 2)
    grid = curve_grid(np.array(sizes, dtype=np.float64) / n_units)
    point = areas(grid, np.array(full), np.array(empty), located[:, 0], located[:, 1])
    drawn = areas(grid, np.full(random_sets, full), np.full(random_sets, empty), rand[..., 0].T, rand[..., 1].T)
    ci = bootstrap_areas(grid, per_ex, resamples=meta["bootstrap"], seed=meta["seed"], level=meta["confidence"])
    table = _table(sizes, n_units, full, empty, located, rand)
    bands = [spread(drawn[:, j]) for j in range(3)]
    return Faithfulness(
        table, full, empty, float(point[0]), float(point[1]), bands[0], bands[1], meta,
        ablated_area=float(point[2]), random_ablated_area=bands[2],
        cpr_ci=(float(ci[0, 0]), float(ci[0, 1])), cmd_ci=(float(ci[1, 0]), float(ci[1, 1])),
        ablated_area_ci=(float(ci[2, 0]), float(ci[2, 1])), band=band,
    )  # fmt: skip


def _check_faithfulness(
    model: Model, ablation: str, metric: str, random_sets: int, batch_size: int, by: str
) -> tuple[str, str, int, int, str]:
    """:func:`faithfulness`'s settings, checked before any forward pass."""
    validate.model(model)
    ablation = validate.choice("ablation", ablation, ABLATIONS)
    metric = validate.choice("metric", metric, FAITHFULNESS_METRICS)
    random_sets = validate.nonneg_int("random_sets", random_sets)
    bs = validate.positive_int("batch_size", batch_size)
    if metric == "logit_diff" and ablation != "corrupt":
        raise ValueError("metric='logit_diff' needs corrupted answers: use it with ablation='corrupt'")
    return ablation, metric, random_sets, bs, validate.choice("by", by, ("auto", "score", "abs"))


def _ranked_units(model: Model, units: Any, by: str) -> _Units:
    """The units ranked (``by="auto"``: ``"abs"`` for edges, ``"score"`` otherwise) and counted: the
    graph's edges, the model's real neurons, its layers, or its experts."""
    if is_edge_input(units) and not _expert_score_shape(model, units):
        by = "abs" if by == "auto" else by
        graph, order, given = edge_ranking(model, units, by)
        return _Units("edge", order, graph.n_edges, given, graph, by)
    by = "score" if by == "auto" else by
    kind, order, given = _ranking(model, units, by)
    n_units = {"neuron": _real_neurons(model).numel(), "layer": neuron_shape(model)[0]}.get(kind)
    return _Units(kind, order, n_units or len(expert_units(model)), given, None, by)


def _unit_masks(ranked: _Units, sizes: list[int], random_sets: int, seed: int, located: bool = True) -> torch.Tensor:
    """``[2 + 2 * len(sizes) * (located + random_sets), n_units]`` bool, True = the unit runs: the full
    model, everything ablated, then per size the located set (``located``) and each random set, kept
    and ablated. The random sets depend on the seed, sizes and unit count only."""
    n_units = ranked.n_units
    gen = torch.Generator().manual_seed(int(seed))
    unit_masks = [torch.ones(n_units, dtype=torch.bool), torch.zeros(n_units, dtype=torch.bool)]
    for k in sizes:
        sets = [ranked.order[:k]] if located else []
        sets += [torch.randperm(n_units, generator=gen)[:k] for _ in range(random_sets)]
        for idx in sets:
            m = torch.zeros(n_units, dtype=torch.bool)
            m[idx] = True
            unit_masks += [m, ~m]  # kept, ablated
    return torch.stack(unit_masks)


def _neuron_keep(model: Model, kind: str, masks: torch.Tensor) -> torch.Tensor:
    """Unit masks as neuron masks ``[n_configs, n_layers, d_mlp]`` (True = the neuron runs)."""
    L, d = neuron_shape(model)
    if kind == "neuron":  # padding neurons (always 0) run in every configuration
        keep = torch.ones(masks.shape[0], L * d, dtype=torch.bool)
        keep[:, _real_neurons(model)] = masks
        return keep.view(-1, L, d)
    if kind == "expert":  # an expert's neurons run or are ablated together; a mixed model's dense layers run
        cols = torch.ones(masks.shape[0], L * len(expert_keys(moe_of(model))), dtype=torch.bool)
        cols[:, expert_units(model)] = masks
        return cols.view(masks.shape[0], L, -1)[:, :, expert_columns(moe_of(model))]
    return masks[:, :, None].expand(-1, L, d)


def _table(
    sizes: list[int], n_units: int, full: float, empty: float, located: np.ndarray, rand: np.ndarray
) -> pd.DataFrame:
    """Per size: the located set's kept / ablated metric and their normalized curves, and the random
    band (mean, 5th and 95th percentile over the draws) of each; ``located`` ``[k, 2]``, ``rand`` ``[k, r, 2]``."""
    span = full - empty
    norm = (lambda v: (v - empty) / span) if abs(span) > 1e-12 else (lambda v: np.full_like(v, np.nan))
    kept_r, abl_r = rand[..., 0], rand[..., 1]
    table = pd.DataFrame(
        {
            "k": sizes,
            "fraction": [k / n_units for k in sizes],
            "kept": located[:, 0],
            "ablated": located[:, 1],
            "faithfulness": norm(located[:, 0]),
            "ablated_faithfulness": norm(located[:, 1]),
        }
    )
    if rand.shape[1]:
        named = (("random_kept", kept_r), ("random_ablated", abl_r), ("random_faithfulness", norm(kept_r)))
        for name, arr in (*named, ("random_ablated_faithfulness", norm(abl_r))):
            table[f"{name}_mean"] = arr.mean(-1)
            table[f"{name}_p05"], table[f"{name}_p95"] = np.quantile(arr, 0.05, -1), np.quantile(arr, 0.95, -1)
    return table
