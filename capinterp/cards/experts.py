"""Expert cards (mixture-of-experts models): where the router sends tokens, and what the expert writes.

:func:`expert_cards` is :func:`capinterp.cards.describe`'s builder for units of kind ``"expert"``
(``(layer, expert)`` keys, :func:`capinterp.units.experts.top_experts`). One streamed pass over the
corpus reads every described expert's routing (:mod:`capinterp.cards._routing`). A card's
``contexts`` are the top contexts by **routing weight** (the router weight the expert gets at the
focus token, 0 where the token was not routed to it; the shared expert's is its sigmoid gate, or 1),
``stats`` that weight's statistics over every corpus token, ``effect`` the direct logit effect of
the expert's summed value vectors (:func:`capinterp.cards.logit_effect.expert_logit_effects`; None
for a shared expert), and ``details``:

- ``routing``: ``tokens`` read, ``routed`` to the expert, ``frequency = routed / tokens``,
  ``mean_weight`` (its mean router weight where routed), and the uniform frequency
  ``top_k / n_experts`` a router that spread tokens evenly would give;
- ``by_count``: the token ids most often routed to it, ``[token, routed count, rate]`` with ``rate``
  the share of that token's occurrences routed to it; ``by_rate``: the highest rates among tokens
  seen at least ``min_count`` times (:data:`MIN_COUNT`);
- ``task`` (with a task): the routing frequency on the task's prompts, the corpus's, and their
  ratio (the expert's routing specificity; ``card.specificity`` is the routing weight's, as for
  neurons: ``(task mean - corpus mean) / corpus std``).

With a task whose examples all have targets, the first :data:`ABLATE` cards carry the single-expert
ablation effect: every neuron of the expert erased (:func:`capinterp.units.experts.expert_neurons`,
:func:`capinterp.interventions.erase`: its output zeroed where tokens are routed to it, the routing
kept), the task evaluated (:func:`capinterp.kernels.evaluate`).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from capinterp.cards._routing import ExpertRouting, expert_routing
from capinterp.cards.card import UnitCard, specificity
from capinterp.core.example import Example

__all__ = ["ABLATE", "MIN_COUNT", "expert_cards", "expert_details_html", "expert_plan", "routing_details"]

#: The top-ranked expert cards ablated one at a time when a task is given.
ABLATE = 10
_NONE = '<span class="meta">none</span>'
#: Occurrences a token needs in the corpus to enter an expert's top tokens by rate.
MIN_COUNT = 5


def _order(key: tuple[int, Hashable]) -> tuple[int, int]:
    return int(key[0]), 1 << 30 if key[1] == "shared" else int(key[1])  # type: ignore[call-overload]


def expert_plan(model: Any, units: Any, top: int, *, source: str = "expert KeySet", across_models: bool = False) -> Any:
    """The :class:`capinterp.cards.inputs.Plan` of an expert KeySet: its ``(layer, expert)`` keys by
    layer, then expert (a shared expert last), at most ``top``. ValueError for a dense model, an
    empty set, a set made for another model, or a key outside the model's expert layers and experts."""
    from capinterp.cards.plan import Plan
    from capinterp.units.base import KeySet
    from capinterp.units.experts import _checked_keys, moe_of

    if not isinstance(units, KeySet) or units.kind != "expert":
        raise TypeError(f"expected a KeySet of kind 'expert', got {type(units).__name__}")
    moe = moe_of(model)
    units.check_model(model, across_models=across_models)
    keys = sorted(_checked_keys(model, moe, units), key=_order)
    if not keys:
        raise ValueError(f"the {source} is empty: nothing to describe")
    return Plan("expert", keys[:top], None, len(keys), source)


def _tokens(model: Any, r: ExpertRouting, order: list[int], k: int) -> list[list[Any]]:
    """``[token, routed count, rate]`` for the first ``k`` token ids of ``order``."""
    return [
        [model.tokenizer.decode([t]), int(r.by_token[t]), int(r.by_token[t]) / int(r.token_totals[t])]
        for t in order[:k]
    ]


def routing_details(model: Any, r: ExpertRouting, k: int, *, top_k: int, n_experts: int) -> dict[str, Any]:
    """The ``routing`` / ``by_count`` / ``by_rate`` details of one expert (module docstring); ties go to
    the more frequent token, then the lower token id."""
    seen = r.by_token.nonzero().flatten().tolist()  # the token ids routed to the expert at least once
    count = {t: int(r.by_token[t]) for t in seen}
    total = {t: int(r.token_totals[t]) for t in seen}
    by_count = sorted(seen, key=lambda t: (-count[t], t))
    by_rate = sorted((t for t in seen if total[t] >= MIN_COUNT), key=lambda t: (-count[t] / total[t], -count[t], t))
    shared = r.unit[1] == "shared"
    return {
        "routing": {
            "tokens": r.tokens,
            "routed": r.routed,
            "frequency": r.routed / r.tokens if r.tokens else None,
            "mean_weight": r.weight_sum / r.routed if r.routed else None,
            "uniform_frequency": 1.0 if shared else top_k / n_experts,
        },
        "by_count": _tokens(model, r, by_count, k),
        "by_rate": _tokens(model, r, by_rate, k),
        "min_count": MIN_COUNT,
    }


def expert_cards(
    model: Any,
    plan: Any,
    corpus: list[str],
    examples: list[Example] | None,
    *,
    k: int,
    progress: bool,
    ablate: int = ABLATE,
    **run: Any,
) -> list[UnitCard]:
    """The cards of ``plan``'s experts (see the module docstring), in the plan's order."""
    from capinterp.cards.logit_effect import expert_logit_effects
    from capinterp.units.experts import _checked_keys, moe_of

    moe = moe_of(model)
    keys: list[tuple[int, Hashable]] = [
        (int(l), e if e == "shared" else int(e))  # type: ignore[call-overload]
        for l, e in _checked_keys(model, moe, plan.keys)
    ]
    if not keys:
        raise ValueError("no experts to describe")
    found = expert_routing(model, keys, corpus, k=k, progress=progress, **run)
    task = None
    if examples:
        task = expert_routing(model, keys, [e.prompt for e in examples], k=1, progress=False, **run)
    routed = [u for u in keys if u[1] != "shared"]
    effects = dict(zip(routed, expert_logit_effects(model, routed, k=k)))
    top_k = _top_k(model, keys[0][0])
    cards = []
    for i, (u, r) in enumerate(zip(keys, found)):
        details = routing_details(model, r, k, top_k=top_k, n_experts=moe.n_experts)
        ts = task[i].acts.stats if task is not None else None
        if task is not None:
            details["task"] = _task_detail(task[i], r)
        cards.append(
            UnitCard(
                unit=u,
                kind="expert",
                contexts=list(r.acts.contexts),
                stats=r.acts.stats,
                task_stats=ts,
                specificity=specificity(ts, r.acts.stats),
                effect=effects.get(u),
                score=plan.scores[u] if plan.scores is not None else None,
                details=details,
            )
        )
    if examples and all(e.target for e in examples):
        n = min(ablate, len(cards))
        for card, effect in zip(cards, expert_ablations(model, keys[:n], examples, run["batch_size"])):
            card.ablation = effect
    return cards


def _top_k(model: Any, layer: int) -> int:
    from capinterp.arch.experts import expert_block

    spec = expert_block(model, layer)
    top_k = int(getattr(spec, "top_k", 0) or 0)
    return top_k or int(getattr(model.cfg, "experts_per_token", 0) or 0) or 1


def _task_detail(t: ExpertRouting, c: ExpertRouting) -> dict[str, Any]:
    task_f = t.routed / t.tokens if t.tokens else None
    corpus_f = c.routed / c.tokens if c.tokens else None
    ratio = task_f / corpus_f if task_f is not None and corpus_f else None
    return {"tokens": t.tokens, "routed": t.routed, "frequency": task_f, "corpus_frequency": corpus_f, "ratio": ratio}


def expert_ablations(
    model: Any, experts: list[tuple[int, Hashable]], examples: list[Example], batch_size: int
) -> list[dict[str, float]]:
    """Per expert: the task's mean target probability and accuracy with all its neurons erased, and
    their change from the unablated model."""
    from capinterp.cards.ablation import ablate_each
    from capinterp.interventions import erase
    from capinterp.units.experts import expert_neurons

    patches = [lambda u=u: erase(model, expert_neurons(model, [u])) for u in experts]
    return ablate_each(model, examples, patches, batch_size)


def expert_details_html(card: Any) -> str:
    """An expert card's routing section: its frequency, its top routed tokens by count and by rate,
    and (with a task) its routing frequency on the task against the corpus."""
    from capinterp.cards.page import _e, _num, _show_token

    d = card.details
    r = d.get("routing", {})
    facts = [
        f"routed {r.get('routed')} of {r.get('tokens')} tokens (frequency {_num(r.get('frequency'))}, "
        f"uniform {_num(r.get('uniform_frequency'))})",
        f"mean router weight when routed {_num(r.get('mean_weight'))}",
    ]
    if "task" in d:
        t = d["task"]
        facts.append(f"task frequency {_num(t.get('frequency'))} ({_num(t.get('ratio'))}x the corpus)")
    parts = [
        f'<div class="label">routing</div><div class="row">{"".join(f"<span>{_e(f)}</span>" for f in facts)}</div>'
    ]
    for title, rows in (
        ("most routed tokens (count)", d.get("by_count", [])),
        (f"highest routing rate (tokens seen at least {d.get('min_count')} times)", d.get("by_rate", [])),
    ):
        items = "".join(
            f'<span class="t" title="{_e(f"{c} routed, rate {_num(rate)}")}">{_show_token(str(t))} '
            f"<small>{c} · {_num(rate, '.2f')}</small></span>"
            for t, c, rate in rows
        )
        parts.append(f'<div class="label">{_e(title)}</div><div class="toks">{items or _NONE}</div>')
    return "".join(parts)
