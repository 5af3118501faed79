"""Certify what a located set misses: a bound, at confidence 1 - delta, from B exact patches.

After a localizer returns a set S, :func:`certify` draws ``budget`` units outside S (strata by the
localizer's own scores, uniform within each stratum, :mod:`capinterp.interventions.certify_bounds`),
ablates each one alone (the exact single-unit patch of ``patching_agreement``, batched through
:func:`capinterp.interventions.faithfulness.ablated_metric`), and bounds (a) how many units outside S
have an effect above ``tau`` and (b) their total effect. A unit's effect is the drop of the mean
probability of the target's first token over the data when it alone is ablated at every position,
so it lies in [-1, 1]; the bounds are on its positive part (``absolute=True``: its size). Units:
FFN neurons, FFN layers, attention heads (:mod:`capinterp.interventions.certify_heads`), experts of a
mixture-of-experts model and circuit edges; proofs in docs/certify.md.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, cast

import numpy as np
import torch

from capinterp.arch.model import neuron_shape
from capinterp.circuits.graph import Circuit, EdgeSet, Graph
from capinterp.core import validate
from capinterp.core.protocol import Model
from capinterp.core.tokens import encode
from capinterp.interventions.certify_bounds import bounds, draw, plan
from capinterp.interventions.certify_heads import head_graph, head_metric, head_units
from capinterp.interventions.edge_faithfulness import edge_metric
from capinterp.interventions.faithfulness import ABLATIONS, _neuron_keep, _real_neurons, ablated_metric
from capinterp.localizers.base import Localizer
from capinterp.units.base import KeySet
from capinterp.units.experts import expert_index, expert_keys, expert_scores, expert_units, moe_of
from capinterp.units.neurons import NeuronScores, NeuronSet

__all__ = ["Certificate", "certify"]

ASSUMPTIONS = (
    "effect(u) = mean p(target's first token) of the full model minus that with unit u alone ablated "
    "({ablation} ablation, every position), over the given data; in [-1, 1]; bounded: its {part}, in [0, 1]. "
    "Units outside S are split into strata by |score| before any patch; each stratum is sampled uniformly "
    "without replacement with a seeded generator. (a) exact hypergeometric bound per stratum, Bonferroni "
    "over the partly sampled strata; (b) Hoeffding (1963, Thm 4, without replacement) on min(x, tau) plus "
    "(1 - tau) x the count bound, delta / 2 each. Each bound holds with probability >= 1 - delta; both at "
    "once >= 1 - 2 delta. Valid for these data and this ablation only."
)


@dataclass(frozen=True)
class Certificate:
    """The result of :func:`certify`: with probability at least ``1 - delta`` (each), at most
    ``count_bound`` of the ``n_outside`` units outside the located set have an effect above ``tau``,
    and their effects total at most ``total_bound``."""

    kind: str
    n_located: int
    n_outside: int
    sampled: int
    budget: int
    tau: float
    delta: float
    count_bound: int
    count_estimate: float
    total_bound: float
    total_estimate: float
    full_metric: float
    strata: tuple[int, ...]
    takes: tuple[int, ...]
    sampled_units: tuple[Any, ...]
    sampled_effects: tuple[float, ...]
    ablation: str
    absolute: bool
    seed: int
    assumptions: str

    def summary(self) -> str:
        """One line: the two bounds and what they rest on."""
        what = "|effect|" if self.absolute else "effect"
        return (
            f"certify ({self.kind}s): of {self.n_outside} units outside the {self.n_located} located, at most "
            f"{self.count_bound} have {what} > {self.tau:g} and their total {what} is <= {self.total_bound:.4g} "
            f"(estimate {self.total_estimate:.4g}; each at {100 * (1 - self.delta):g} % confidence; "
            f"{self.sampled} exact patches, {self.ablation} ablation, p(target) {self.full_metric:.4g})"
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _neuron_units(model: Model, located: Any, scores: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(in S [n_units] bool, scores [n_units], flat neuron index [n_units]) over the real neurons."""
    located.check_model(model)
    real = _real_neurons(model)
    flat = located.mask.flatten()
    if int(flat[real].sum()) != len(located):
        raise ValueError("the NeuronSet holds padding neurons of this model (past a dense layer's own width)")
    if scores is None:
        s = torch.zeros(real.numel(), dtype=torch.float64)
    else:
        t = scores.scores if isinstance(scores, NeuronScores) else torch.as_tensor(scores)
        if tuple(t.shape) != neuron_shape(model):
            raise ValueError(f"scores must be [{', '.join(map(str, neuron_shape(model)))}], got {tuple(t.shape)}")
        s = t.flatten()[real].double()
    return flat[real].numpy(), s.numpy(), real.numpy()


def _layer_units(model: Model, located: KeySet, scores: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    L = neuron_shape(model)[0]
    layers = [int(k) for k in located]  # type: ignore[call-overload]
    if located.n_units not in (None, L) or any(not 0 <= k < L for k in layers):
        raise ValueError(f"the layer set {sorted(layers)} (of {located.n_units} layers) does not fit this model's {L}")
    inside = np.zeros(L, dtype=bool)
    inside[layers] = True
    s = np.zeros(L) if scores is None else np.asarray(torch.as_tensor(scores, dtype=torch.float64)).ravel()
    if len(s) != L:
        raise ValueError(f"layer scores need {L} values (one per layer), got {len(s)}")
    return inside, s, np.arange(L)


def _expert_units(model: Model, located: KeySet, scores: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Over the model's experts (:func:`capinterp.units.experts.expert_units` order): in S, scores
    (per-expert ``[n_layers, n_columns]``, or neuron scores summed per expert by size), flat index."""
    flat = expert_units(model)
    inside = torch.isin(flat, expert_index(model, located)).numpy()
    if scores is None:
        s = torch.zeros(len(flat), dtype=torch.float64)
    else:
        t = scores.scores if isinstance(scores, NeuronScores) else torch.as_tensor(scores)
        per = (
            t
            if t.dim() == 2 and t.shape[1] == len(expert_keys(moe_of(model)))
            else expert_scores(model, t, absolute=True)
        )
        s = per.double().flatten()[flat]
    return inside, s.numpy(), flat.numpy()


def _edge_units(model: Model, located: Any, scores: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, Graph]:
    """Over the graph's edges (``graph.edges()`` order): in S, scores (the circuit's own, or ``scores=``
    ``[n_src, n_slots]``), position; and the graph."""
    graph = located.graph
    if graph.signature != Graph.from_model(model, graph.granularity).signature:
        raise ValueError(f"the circuit's graph ({graph.signature}) is not this model's graph")
    edges = graph.edges()
    pos = {(graph.sources.index(a), graph.slots.index(b)): j for j, (a, b) in enumerate(edges)}
    mask = graph.mask_of(located.keys()) if isinstance(located, EdgeSet) else located.mask
    inside = np.zeros(len(edges), dtype=bool)
    inside[[pos[(int(r), int(c))] for r, c in mask.nonzero().tolist()]] = True
    own = None if isinstance(located, EdgeSet) else located.scores
    t = own if scores is None else torch.as_tensor(scores)
    s = np.zeros(len(edges))
    if t is not None:
        s = np.array([float(t[r, c]) for (r, c) in sorted(pos, key=pos.__getitem__)])
    return inside, s, np.arange(len(edges)), graph


def _units(model: Model, located: Any, scores: Any) -> tuple[str, np.ndarray, np.ndarray, np.ndarray, bool, Any]:
    """(kind, in S, scores, unit ids, had scores, the graph of edges or None) of the located set's unit space."""
    if isinstance(located, Localizer) and located.unit_kind == "edge":
        if getattr(located, "circuit_", None) is None:
            raise ValueError(f"{type(located).__name__} is not fitted: call .fit(data) before certify")
        located = cast(Any, located).circuit_
    if isinstance(located, Localizer):
        if getattr(located, "units_", None) is None:
            raise ValueError(f"{type(located).__name__} is not fitted: call .fit(data) before certify")
        if scores is None:
            own = getattr(located, "scores_", None) if located.unit_kind == "neuron" else None
            scores = own if own is not None else getattr(located, "layer_scores_", None)
        located = cast(Any, located).units_
    if isinstance(located, NeuronSet):
        return ("neuron", *_neuron_units(model, located, scores), scores is not None, None)
    if isinstance(located, KeySet) and located.kind == "layer":
        return ("layer", *_layer_units(model, located, scores), scores is not None, None)
    if isinstance(located, KeySet) and located.kind == "expert":
        return ("expert", *_expert_units(model, located, scores), scores is not None, None)
    if isinstance(located, KeySet) and located.kind == "head":
        inside, s, ids, graph = head_units(model, located, scores)
        return "head", inside, s, ids, scores is not None, graph
    if isinstance(located, (Circuit, EdgeSet)):
        inside, s, ids, graph = _edge_units(model, located, scores)
        had = scores is not None or getattr(located, "scores", None) is not None
        return "edge", inside, s, ids, had, graph
    if isinstance(located, NeuronScores):
        raise TypeError("certify needs the located set: pass scores.top_k(k) (or .select()) and scores=scores")
    kind = getattr(located, "kind", type(located).__name__)
    raise NotImplementedError(
        f"certify covers neurons (NeuronSet), FFN layers (layer KeySet), experts (expert KeySet), attention heads "
        f"(head KeySet) and circuit edges (Circuit, EdgeSet, a fitted KnowledgeCircuit), not {kind!r}"
    )


def _keep(model: Model, kind: str, ids: np.ndarray, n_units: int) -> torch.Tensor:
    """``[1 + len(ids), L, d]`` bool: the full model, then each unit ablated alone (``ids``:
    positions among the ``n_units`` units of the kind)."""
    L, d = neuron_shape(model)
    if kind == "expert":
        masks = torch.ones(1 + len(ids), n_units, dtype=torch.bool)
        masks[torch.arange(1, len(ids) + 1), torch.as_tensor(ids, dtype=torch.long)] = False
        return _neuron_keep(model, "expert", masks)
    keep = torch.ones(1 + len(ids), L * d if kind == "neuron" else L, dtype=torch.bool)
    keep[torch.arange(1, len(ids) + 1), torch.as_tensor(ids, dtype=torch.long)] = False
    return keep.view(-1, L, d) if kind == "neuron" else keep[:, :, None].expand(-1, L, d).contiguous()


def _patched(model: Model, kind: str, graph: Any, items: list, ids: np.ndarray, n_units: int, ablation: str, bs: int):
    """``[1 + len(ids)]`` mean p(target): the full model, then each unit ablated alone."""
    if kind == "head":
        return head_metric(model, graph, items, ids, ablation, bs)
    if kind != "edge":
        return ablated_metric(model, items, _keep(model, kind, ids, n_units), ablation=ablation, batch_size=bs)
    kept = torch.ones(1 + len(ids), n_units, dtype=torch.bool)
    kept[torch.arange(1, len(ids) + 1), torch.as_tensor(ids, dtype=torch.long)] = False
    return edge_metric(model, graph, items, kept, ablation=ablation, metric="prob", batch_size=bs)


def _keys(model: Model, kind: str, units: np.ndarray) -> list[Any]:
    """The sampled units' keys: ``(layer, neuron)``, a layer, ``(layer, head)`` or ``(layer, expert)``."""
    if kind == "head":
        return [head_graph(model)[1][int(u)] for u in units]
    if kind == "layer":
        return [int(u) for u in units]
    if kind == "neuron":
        return [divmod(int(u), neuron_shape(model)[1]) for u in units]
    names = expert_keys(moe_of(model))
    return [(l, names[c]) for l, c in (divmod(int(u), len(names)) for u in units)]


def _check(budget: Any, tau: Any, delta: Any, strata: Any, top: Any, ablation: Any, absolute: Any, seed: Any) -> tuple:
    return (
        validate.positive_int("budget", budget),
        validate.probability("tau", tau, high_open=True),
        validate.finite_float("delta", delta, low=0.0, high=1.0, low_open=True, high_open=True),
        validate.positive_int("strata", strata),
        validate.nonneg_int("top", top),
        validate.choice("ablation", ablation, ABLATIONS[:2]),
        validate.boolean("absolute", absolute),
        validate.nonneg_int("seed", seed),
    )


def certify(
    model: Model,
    located: Any,
    data: Any,
    *,
    budget: int = 64,
    tau: float = 0.01,
    delta: float = 0.05,
    scores: Any = None,
    strata: int = 1,
    top: int = 0,
    ablation: str = "zero",
    absolute: bool = False,
    seed: int = 0,
    batch_size: int = 16,
) -> Certificate:
    """Bound what ``located`` misses, from ``budget`` exact single-unit patches outside it.

    ``located``: a fitted neuron, layer or circuit localizer (its own scores set the strata), a
    ``NeuronSet``, a layer, head or expert ``KeySet``, a ``Circuit`` or an ``EdgeSet`` (then ``scores=`` a
    ``NeuronScores``, a ``[n_layers, d_mlp]``, ``[n_layers]``, ``[n_layers, n_heads]``, per-expert or ``[n_src, n_slots]``
    tensor, or None). ``tau`` in [0, 1): the effect (a drop of p(target)) that counts as missed;
    ``delta``: the error probability of each bound; ``strata``: 1 (the default: one uniform sample)
    or more score strata (geometric sizes, equal budget: the higher, the denser); ``top``: the
    ``top`` best-scored outside units are patched whole (out of the budget; tighter where the misses
    sit among the outside units' top scores); ``ablation``: ``"zero"`` or ``"mean"`` (mean over
    ``data``). With ``budget`` at least the number of outside units every unit is patched and the
    bounds are the exact values. A fitted localizer keeps the result as ``certificate_`` (its
    ``summary()`` then shows the certificate's line). Proofs and coverage: docs/certify.md.
    """
    validate.model(model)
    budget, tau, delta, strata, top, ablation, absolute, seed = _check(
        budget, tau, delta, strata, top, ablation, absolute, seed
    )
    items = encode(model, validate.examples(data, need_target=True))
    kind, inside, s, ids, had_scores, graph = _units(model, located, scores)
    if not had_scores and (strata > 1 or top):
        raise ValueError("strata > 1 and top > 0 rank the outside units by score: pass scores= (or a fitted localizer)")
    outside = np.flatnonzero(~inside)
    p = plan(s[outside], budget, strata, top)
    picked = draw(p, np.random.default_rng(seed))
    pos = outside[np.concatenate(picked)] if picked else np.zeros(0, dtype=int)
    units = ids[pos]
    vals = _patched(model, kind, graph, items, units if kind != "expert" else pos, len(ids), ablation, batch_size)
    effects = vals[0] - vals[1:]
    x = np.abs(effects) if absolute else np.maximum(effects, 0.0)
    cuts = np.cumsum([len(q) for q in picked])[:-1]
    b = bounds(p.sizes, p.take, np.split(x, cuts), tau, delta)
    keys = _keys(model, kind, units) if kind != "edge" else [graph.edges()[int(u)] for u in units]
    cert = Certificate(
        kind, int(inside.sum()), len(outside), len(units), budget, tau, delta, b.count_bound, b.count_estimate,
        b.total_bound, b.total_estimate, float(vals[0]), p.sizes, p.take, tuple(keys),
        tuple(float(e) for e in effects), ablation, absolute, seed,
        ASSUMPTIONS.format(ablation=ablation, part="size" if absolute else "positive part"),
    )  # fmt: skip
    if isinstance(located, Localizer):  # its summary() shows the certificate's line
        located.certificate_ = cert
    return cert
