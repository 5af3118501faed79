"""``describe(model, units, texts, task)``: a card per located unit, saying what it does.

>>> cnl = ci.CNL(model).fit(ds)
>>> cards = ci.describe(model, cnl, task=ds)            # the located neurons, best score first
>>> cards.frame                                         # one row per unit
>>> cards.save("cards.html")                            # the offline cards page

Everything is checked before the first forward pass: the units (:mod:`capinterp.cards.inputs`:
empty sets, a result saved for another model, units the model does not have), the texts, the task and
every number. Then, for neurons: one streamed pass over the corpus reads every described neuron and
the chance level's random neurons at once (:func:`capinterp.cards.contexts.top_contexts`), one pass
over the task's prompts their statistics (:func:`capinterp.cards.contexts.activation_stats`), the
value vectors' logit effects are read from the weights
(:func:`capinterp.cards.logit_effect.neuron_logit_effects`), and the first ``ablate`` units are
erased one at a time on the task (:func:`capinterp.kernels.evaluate`). For layers: the same
contexts and statistics, of the layer's MLP output norm ``||mlp_out||`` at each token, and the
ablation of all the layer's neurons. Experts (:mod:`capinterp.cards.experts`), heads
(:mod:`capinterp.cards.heads`) and circuits (:mod:`capinterp.cards.circuits`) have builders of
their own (:data:`BUILDERS`). :mod:`capinterp.cards.card` defines each field.
"""

from __future__ import annotations

import random
from collections.abc import Hashable
from typing import Any

from capinterp.cards.card import Cards, UnitCard, specificity
from capinterp.cards.inputs import Plan, resolve_texts, resolve_units
from capinterp.core import validate
from capinterp.core.example import Example

__all__ = ["BUILDERS", "CHANCE_NEURONS", "DEFAULT_MAX_TOKENS", "ablation_effects", "describe"]

#: Random neurons per layer (of the described neurons' layers) that make the specificity's chance level.
CHANCE_NEURONS = 16
#: Tokens read of each text of the default corpus (``texts=None``).
DEFAULT_MAX_TOKENS = 256


def describe(
    model: Any,
    units: Any,
    texts: Any = None,
    task: Any = None,
    *,
    top: int = 50,
    k: int = 10,
    ablate: int = 10,
    batch_size: int = 8,
    max_tokens: int | None = None,
    device: Any = None,
    progress: bool = True,
    across_models: bool = False,
) -> Cards:
    """A card per unit of ``units``: what it does (see :mod:`capinterp.cards.card`).

    Args:
        model: the model the units were located in.
        units: a NeuronSet, NeuronScores (its ``top`` highest-scoring neurons), a layer, expert or
            head KeySet, a ``[n_layers, n_heads]`` head score array, a circuit (a Circuit, an edge or
            node set; its strongest input-to-logit paths, then a card per node on them), or a fitted
            localizer (its ``units_``, ranked by its scores). At most ``top`` units get cards.
        texts: the corpus: a list of strings, the path of a ``.txt`` (paragraphs) or ``.jsonl``
            file, or None: the task's prompts plus the data folder's local text
            (``CAPINTERP_DATA``, :func:`capinterp.data.local_texts`), or without one the built-in
            text. ``Cards.meta["texts_source"]`` says which.
        task: examples of the behaviour (a list of Example / dicts): the task statistics, the
            specificity and the ablation effects are measured on them; None leaves those out.
        top: the most units described.
        k: top contexts per unit, and promoted / suppressed tokens per unit.
        ablate: how many of the top-ranked units are erased one at a time on ``task`` (0: none).
        batch_size: texts per forward pass (and task examples per evaluation batch).
        max_tokens: read at most this many tokens of each text (a longer text than the model's
            context is a ValueError otherwise); with ``texts=None`` it defaults to
            :data:`DEFAULT_MAX_TOKENS` (or the model's context, if shorter).
        device: where the activations are reduced (default: the model's device).
        progress: progress bars on stderr.
        across_models: describe a result saved for another checkpoint of the same architecture, or
            loaded from a file that records no model (refused by default).
    """
    validate.model(model)
    top, k = validate.positive_int("top", top), validate.positive_int("k", k)
    ablate, batch_size = validate.nonneg_int("ablate", ablate), validate.positive_int("batch_size", batch_size)
    progress = validate.boolean("progress", progress)
    validate.device("device", device)
    if max_tokens is not None:
        validate.positive_int("max_tokens", max_tokens)
    elif texts is None:  # the package's choice of corpus: cut to a length every model reads
        max_tokens = min(DEFAULT_MAX_TOKENS, int(model.cfg.n_ctx))
    plan = resolve_units(model, units, top, across_models=validate.boolean("across_models", across_models))
    examples = None if task is None else validate.examples(task, "task", need_target=ablate > 0)
    corpus, source = resolve_texts(texts, examples)
    _check_lengths(model, corpus, examples, max_tokens)
    run = {"batch_size": batch_size, "device": device, "max_tokens": max_tokens}
    cards = _builder(plan.kind)(model, plan, corpus, examples, k=k, progress=progress, ablate=ablate, **run)
    n_ablate = sum(c.ablation is not None for c in cards)
    meta = {
        "model": getattr(model, "capinterp_name", None),
        "input": plan.source,
        "unit_kind": plan.kind,
        "units_in_input": plan.n_total,
        "cards": len(cards),
        "texts_source": source,
        "n_texts": len(corpus),
        "task_examples": len(examples) if examples is not None else 0,
        "ablated": f"the top {n_ablate} units, one at a time" if n_ablate else "none",
        "chance_neurons_per_layer": CHANCE_NEURONS if plan.kind == "neuron" else 0,
    }
    return Cards(cards, meta)


#: Unit kind -> "module:function" building that kind's cards, for the kinds not built here; each,
#: like :func:`_neuron_cards` and :func:`_layer_cards`, takes ``(model, plan, corpus, examples, *, k,
#: progress, ablate, batch_size, device, max_tokens)`` and fills ``card.ablation`` for its first
#: ``ablate`` units.
BUILDERS: dict[str, str] = {
    "expert": "capinterp.cards.experts:expert_cards",
    "head": "capinterp.cards.heads:head_cards",
    "edge": "capinterp.cards.circuits:circuit_cards",
    "node": "capinterp.cards.circuits:circuit_cards",
}


def _builder(kind: str) -> Any:
    import importlib

    if kind == "neuron":
        return _neuron_cards
    if kind == "layer":
        return _layer_cards
    module, name = BUILDERS[kind].split(":")
    return getattr(importlib.import_module(module), name)


def _check_lengths(model: Any, corpus: list[str], examples: list[Example] | None, max_tokens: int | None) -> None:
    """ValueError (before any forward) naming a text or task prompt longer than the model's context."""
    from capinterp.cards._act_stream import encode_texts

    encode_texts(model, corpus, max_tokens)
    if examples is not None:
        encode_texts(model, [e.prompt for e in examples], max_tokens)


def _random_peers(model: Any, units: list[Hashable], seed: int = 0) -> list[tuple[int, int]]:
    """:data:`CHANCE_NEURONS` random real neurons of each described layer, none of them described."""
    from capinterp.arch.model import valid_neurons

    valid = valid_neurons(model)
    taken = set(units)
    rng = random.Random(seed)
    peers: list[tuple[int, int]] = []
    for layer in sorted({u[0] for u in units}):  # type: ignore[index]
        free = [(layer, n) for n in range(valid.shape[1]) if valid[layer, n] and (layer, n) not in taken]
        peers += sorted(rng.sample(free, min(CHANCE_NEURONS, len(free))))
    return peers


def _chance(peers: list[tuple[int, int]], spec: dict[Any, float | None]) -> dict[int, dict[str, float]]:
    import numpy as np

    out = {}
    for layer in sorted({p[0] for p in peers}):
        vals = [v for p in peers if p[0] == layer and (v := spec[p]) is not None]
        if vals:
            out[layer] = {"n": len(vals), "mean": float(np.mean(vals)), "q95": float(np.quantile(vals, 0.95))}
    return out


def _neuron_cards(
    model: Any,
    plan: Plan,
    corpus: list[str],
    examples: list[Example] | None,
    *,
    k: int,
    progress: bool,
    ablate: int,
    **run: Any,
) -> list[UnitCard]:
    from capinterp.cards.contexts import activation_stats, top_contexts
    from capinterp.cards.logit_effect import neuron_logit_effects

    keys = [(int(u[0]), int(u[1])) for u in plan.keys]
    peers = _random_peers(model, list(keys)) if examples is not None else []
    found = top_contexts(model, keys + peers, corpus, k=k, progress=progress, **run)
    corpus_stats = {tuple(a.unit): a.stats for a in found}
    task_stats: dict[Hashable, Any] = {}
    if examples is not None:
        stats = activation_stats(model, keys + peers, [e.prompt for e in examples], progress=False, **run)
        task_stats = dict(zip(keys + peers, stats))
    spec = {u: specificity(task_stats.get(u), corpus_stats[u]) for u in keys + peers}
    chance = _chance(peers, spec)
    effects = neuron_logit_effects(model, keys, k=k)
    cards = []
    for u, acts, effect in zip(keys, found, effects):
        cards.append(
            UnitCard(
                unit=u,
                kind="neuron",
                contexts=list(acts.contexts),
                stats=acts.stats,
                task_stats=task_stats.get(u),
                specificity=spec[u],
                chance=chance.get(u[0]) if examples is not None else None,
                effect=effect,
                score=plan.scores[u] if plan.scores is not None else None,
            )
        )
    return _ablated(model, "neuron", cards, examples, ablate, run["batch_size"])


def _layer_cards(
    model: Any,
    plan: Plan,
    corpus: list[str],
    examples: list[Example] | None,
    *,
    k: int,
    progress: bool,
    ablate: int,
    **run: Any,
) -> list[UnitCard]:
    from capinterp.cards.layer_norms import layer_norm_contexts

    layers = [int(u) for u in plan.keys]
    found = layer_norm_contexts(model, layers, corpus, k=k, progress=progress, **run)
    task = (
        layer_norm_contexts(model, layers, [e.prompt for e in examples], k=1, progress=False, **run)
        if examples
        else None
    )
    cards = []
    for i, (layer, acts) in enumerate(zip(layers, found)):
        ts = task[i].stats if task is not None else None
        score = plan.scores[layer] if plan.scores is not None else None
        cards.append(
            UnitCard(
                layer, "layer", list(acts.contexts), acts.stats, ts, specificity(ts, acts.stats), None, None, score
            )
        )
    return _ablated(model, "layer", cards, examples, ablate, run["batch_size"])


def _ablated(
    model: Any, kind: str, cards: list[UnitCard], examples: list[Example] | None, ablate: int, batch_size: int
) -> list[UnitCard]:
    """``cards``, the first ``ablate`` of them with their :func:`ablation_effects` (none without a task)."""
    units = [c.unit for c in cards[:ablate]]
    for card, effect in zip(cards, ablation_effects(model, kind, units, examples, batch_size)):
        card.ablation = effect
    return cards


def ablation_effects(
    model: Any, kind: str, units: list[Hashable], examples: list[Example] | None, batch_size: int
) -> list[dict[str, float]]:
    """For each unit, the task's mean target probability and accuracy with only that unit erased,
    and their change from the unablated model (a layer: all its MLP neurons erased)."""
    import torch

    from capinterp.arch.model import neuron_shape, valid_neurons
    from capinterp.cards.ablation import ablate_each
    from capinterp.interventions import erase
    from capinterp.units.neurons import NeuronSet

    if not units or examples is None:
        return []
    shape = neuron_shape(model)

    def erased(u: Any) -> Any:
        mask = torch.zeros(shape, dtype=torch.bool)
        if kind == "neuron":
            mask[u[0], u[1]] = True
        else:
            mask[int(u)] = valid_neurons(model)[int(u)].cpu()
        return lambda: erase(model, NeuronSet(mask))

    return ablate_each(model, examples, [erased(u) for u in units], batch_size)
