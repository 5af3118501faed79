"""What do capability neurons do? Digits / answers promoted and arithmetic contexts, against random neurons.

For each located neuron set (CNL's arithmetic neurons on the ``sub`` capability; KN's fact neurons
on the builtin facts the model knows), three shares of its neurons, each beside the same share of
``n_random`` seeded random neuron sets of equal size drawn from the same layers
(:meth:`~capinterp.units.neuron_set.NeuronSet.random_like` with ``per_layer=True``), whose mean and
2.5 / 97.5 percentiles are the chance level and its 95% interval:

* **digits**: at least ``m_digits`` of the neuron's top-``k`` promoted tokens
  (:func:`capinterp.cards.logit_effect.neuron_logit_effects`, ``norms="fold"``) are digit tokens: the
  token string with surrounding whitespace stripped is non-empty and every character is one of
  ``0123456789``;
* **answers**: at least ``m_answers`` of its top-``k`` promoted tokens are among the task's target
  tokens (every token id of every target of the located set's task, as
  :func:`capinterp.core.tokens.encode` splits it);
* **arithmetic contexts**: at least ``m_contexts`` of its top-``k`` contexts
  (:func:`capinterp.cards.contexts.top_contexts`) lie in the arithmetic part of a mixed corpus:
  generated arithmetic, each example's prompt and answer as one text (:func:`arithmetic_corpus`),
  and non-arithmetic text: the builtin facts' paraphrase sentences plus, when a data folder is set
  (``CAPINTERP_DATA``), local texts that contain no digit (:func:`text_corpus`).

Every neuron's three counts are computed once (located and random sets together), so a set's share
is the mean of its neurons' indicators. Quick mode: Gemma-sized small sets (12 ``sub`` problems as
the capability experiments prepare them, 4 facts, 20 random sets, 60 + 60 texts); full: 24
problems, 16 facts, 100 random sets, 200 + 200 texts. Run it on each model with ``--model``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from capinterp.cards.contexts import top_contexts
from capinterp.cards.logit_effect import neuron_logit_effects
from capinterp.core import validate
from capinterp.core.example import Example, as_examples
from capinterp.core.protocol import Model
from capinterp.core.tokens import encode
from capinterp.experiments.base import Context, ExperimentResult, experiment
from capinterp.units.neurons import NeuronSet

__all__ = [
    "COLUMNS",
    "PROPERTIES",
    "Criteria",
    "arithmetic_corpus",
    "is_digit_token",
    "neuron_roles",
    "roles_table",
    "run",
    "set_shares",
    "target_tokens",
    "text_corpus",
]

NAME, TITLE = "unit_roles", "What do capability neurons do? Digits, answers and arithmetic contexts vs random neurons"
PROPERTIES = ("digits", "answers", "arithmetic contexts")
COLUMNS = ["set", "task", "property", "n_neurons", "share", "random_mean", "random_lo", "random_hi", "n_random"]
_DIGITS = frozenset("0123456789")
_CHUNK = 256  # neurons per logit-effect call: bounds the [n, d_vocab] effects in memory


@dataclass(frozen=True)
class Criteria:
    """The thresholds of the three properties (module docstring): top-``k`` tokens and contexts."""

    k: int = 10
    m_digits: int = 2
    m_answers: int = 1
    m_contexts: int = 6

    def __post_init__(self) -> None:
        validate.positive_int("k", self.k)
        for name in ("m_digits", "m_answers", "m_contexts"):
            m = validate.positive_int(name, getattr(self, name))
            if m > self.k:
                raise ValueError(f"{name} must be at most k ({self.k}), got {m}")


def is_digit_token(s: str) -> bool:
    """A digit token: stripped of whitespace, non-empty and only the characters ``0123456789``."""
    t = s.strip()
    return bool(t) and set(t) <= _DIGITS


def target_tokens(model: Model, examples: Sequence[Any]) -> frozenset[int]:
    """Every token id of every target of ``examples``, as :func:`~capinterp.core.tokens.encode` splits it."""
    items = encode(model, as_examples(examples), on_mismatch="skip")
    return frozenset(t for it in items for t in it.target_ids)


def arithmetic_corpus(n: int, seed: int = 0) -> list[str]:
    """``n`` generated 1-OP problems over ``+-*/`` with 1-2 digit operands, zero-shot, each prompt + answer."""
    from capinterp.data import arithmetic

    ds = arithmetic(ops="+-*/", n=n, seed=seed, digits=(1, 2), style="zeroshot")
    return [e.prompt + e.target for e in ds]


def text_corpus(n: int, seed: int = 0) -> list[str]:
    """Non-arithmetic text: the builtin facts' paraphrases (prompt + answer), then local texts of the
    data folder without a digit (when ``CAPINTERP_DATA`` is set), ``n`` in all at most."""
    from capinterp.data.corpus import local_texts
    from capinterp.data.paraphrases import builtin_paraphrases

    out = [e.prompt + e.target for bag in builtin_paraphrases() for e in bag]
    local: list[str] = []
    if len(out) < n:
        try:
            local = local_texts(n=4 * n, seed=seed)
        except (FileNotFoundError, ValueError):
            pass
    out += [t for t in local if not _DIGITS & set(t)]
    return out[:n]


def neuron_roles(
    model: Model,
    units: Sequence[tuple[int, int]],
    texts: Sequence[str],
    is_arith: Sequence[bool],
    targets: Mapping[str, frozenset[int]],
    *,
    criteria: Criteria = Criteria(),
    batch_size: int = 8,
    max_tokens: int | None = 64,
) -> pd.DataFrame:
    """Per neuron: ``digits`` (digit tokens among its top-k promoted), ``answers:<task>`` (target tokens
    of each task among them) and ``arith_contexts`` (top-k contexts from texts with ``is_arith``)."""
    units = [(int(l), int(i)) for l, i in units]
    if len(is_arith) != len(texts):
        raise ValueError(f"is_arith has {len(is_arith)} flags for {len(texts)} texts")
    k = criteria.k
    rows: dict[str, list[int]] = {"digits": [], **{f"answers:{t}": [] for t in targets}}
    for start in range(0, len(units), _CHUNK):
        for eff in neuron_logit_effects(model, units[start : start + _CHUNK], k=k):
            rows["digits"].append(sum(is_digit_token(s) for s, _, _ in eff.promoted))
            for task, ids in targets.items():
                rows[f"answers:{task}"].append(sum(t in ids for _, t, _ in eff.promoted))
    acts = top_contexts(
        model, units, list(texts), k=k, window=0, batch_size=batch_size, max_tokens=max_tokens, progress=False
    )
    rows["arith_contexts"] = [sum(bool(is_arith[c.text_index]) for c in a.contexts) for a in acts]
    frame = pd.DataFrame({"layer": [l for l, _ in units], "neuron": [i for _, i in units], **rows})
    return frame.set_index(["layer", "neuron"])


def set_shares(
    roles: pd.DataFrame, units: Sequence[tuple[int, int]], task: str, criteria: Criteria
) -> dict[str, float]:
    """The share of ``units`` with each property (:data:`PROPERTIES`), from :func:`neuron_roles`' counts."""
    sub = roles.loc[[(int(l), int(i)) for l, i in units]]
    return {
        "digits": float((sub["digits"] >= criteria.m_digits).mean()),
        "answers": float((sub[f"answers:{task}"] >= criteria.m_answers).mean()),
        "arithmetic contexts": float((sub["arith_contexts"] >= criteria.m_contexts).mean()),
    }


def _keys(ns: NeuronSet) -> list[tuple[int, int]]:
    return [(int(l), int(i)) for l, i in ns.mask.nonzero().tolist()]


def roles_table(
    model: Model,
    located: Mapping[str, tuple[NeuronSet, str, Sequence[Example]]],
    texts: Sequence[str],
    is_arith: Sequence[bool],
    *,
    n_random: int = 20,
    seed: int = 0,
    criteria: Criteria = Criteria(),
    batch_size: int = 8,
    max_tokens: int | None = 64,
) -> pd.DataFrame:
    """One row per (located set, property): its share, and the random sets' mean and 95% interval.

    ``located``: set name -> (neurons, task name, the task's examples, whose targets are the answers).
    Random set ``r`` of a set is ``neurons.random_like(seed * 1000 + r, per_layer=True)``.
    """
    n_random = validate.positive_int("n_random", n_random)
    sets = {name: (ns, task) for name, (ns, task, _) in located.items() if len(ns)}
    randoms = {
        name: [ns.random_like(seed * 1000 + r, per_layer=True) for r in range(n_random)]
        for name, (ns, _) in sets.items()
    }
    every = sorted({u for name, (ns, _) in sets.items() for s in (ns, *randoms[name]) for u in _keys(s)})
    targets = {task: target_tokens(model, exs) for _, task, exs in located.values()}
    roles = (
        neuron_roles(
            model, every, texts, is_arith, targets, criteria=criteria, batch_size=batch_size, max_tokens=max_tokens
        )
        if every
        else None
    )
    rows = []
    for name, (ns, task, _) in located.items():
        if roles is None or not len(ns):
            rows += [{"set": name, "task": task, "property": p, "n_neurons": 0, "n_random": 0} for p in PROPERTIES]
            continue
        own = set_shares(roles, _keys(ns), task, criteria)
        rnd = [set_shares(roles, _keys(r), task, criteria) for r in randoms[name]]
        for p in PROPERTIES:
            v = np.array([r[p] for r in rnd])
            lo, hi = np.percentile(v, [2.5, 97.5])
            rows.append(
                {
                    "set": name,
                    "task": task,
                    "property": p,
                    "n_neurons": len(ns),
                    "share": own[p],
                    "random_mean": float(v.mean()),
                    "random_lo": float(lo),
                    "random_hi": float(hi),
                    "n_random": n_random,
                }
            )
    return pd.DataFrame(rows, columns=COLUMNS)


def roles_figure(table: pd.DataFrame) -> go.Figure:
    """Located share (bars) against the random sets' mean with its 95% interval, per set and property."""
    fig = go.Figure()
    x = [f"{s}: {p}" for s, p in zip(table["set"], table["property"])]
    fig.add_bar(x=x, y=table["share"], name="located")
    err = {
        "type": "data",
        "symmetric": False,
        "array": table["random_hi"] - table["random_mean"],
        "arrayminus": table["random_mean"] - table["random_lo"],
    }
    fig.add_scatter(x=x, y=table["random_mean"], mode="markers", error_y=err, name="random (mean, 95%)")
    fig.update_layout(title="What do capability neurons do? Located vs random neurons", yaxis_title="share of neurons")
    return fig


def _located(ctx: Context) -> dict[str, tuple[NeuronSet, str, list[Example]]]:
    """CNL's ``sub`` neurons (the capability experiments' cached fits, sigma 6) and KN's fact neurons
    (the union of each known fact's coarse set, ``refine=False``; none on a model that knows no fact)."""
    from capinterp.experiments import capability_data as cd
    from capinterp.experiments.faithfulness import sub_and_facts
    from capinterp.localizers.kn import KN

    s = cd.settings(ctx)
    sub, facts = sub_and_facts(ctx, ctx.size(4, 16))
    cnl = cd.located_scores(ctx.localize, "cnl", sub, ctx.seed, **s["params"]["cnl"]).select(sigma=6.0)
    out = {"CNL (sub)": (cnl, "sub", list(sub.locate))}
    if facts:
        ig = ctx.ig(4, 20)
        kn = KN(ctx.model, steps=ig["steps"], rule=ig["rule"], refine=False, progress=False).fit(facts)
        out["KN (facts)"] = (kn.neurons_, "facts", facts)
    return out


@experiment(NAME, TITLE)
def run(ctx: Context) -> ExperimentResult:
    """CNL's arithmetic and KN's fact neurons: digit / answer promoters and arithmetic contexts vs chance."""
    criteria = Criteria()
    located = _located(ctx)
    n_text = ctx.size(60, 200)
    arith, other = arithmetic_corpus(n_text, ctx.seed), text_corpus(n_text, ctx.seed)
    texts, is_arith = arith + other, [True] * len(arith) + [False] * len(other)
    n_random = ctx.size(20, 100)
    table = roles_table(ctx.model, located, texts, is_arith, n_random=n_random, seed=ctx.seed, criteria=criteria)
    info = {
        "criteria": vars(criteria),
        "corpus": {"arithmetic": len(arith), "other": len(other)},
        "n_random": n_random,
        "notes": [
            "share = fraction of the set's neurons with the property; random_* = the same share for "
            f"{n_random} equal-size random sets drawn per layer: mean and 2.5 / 97.5 percentiles (the chance level).",
            f"digits: >= {criteria.m_digits} digit tokens among the top {criteria.k} promoted; answers: >= "
            f"{criteria.m_answers} of the task's target tokens among them; arithmetic contexts: >= "
            f"{criteria.m_contexts} of the top {criteria.k} contexts from the arithmetic texts.",
        ],
    }
    neurons = {name.split(" ")[0].lower() + "_" + task: ns for name, (ns, task, _) in located.items()}
    return ExperimentResult(NAME, TITLE, table, roles_figure(table), info, neurons)
