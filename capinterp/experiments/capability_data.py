"""What the capability experiments (commonality, erase, cross_capability) share.

One preparation of each capability, so the three experiments localize on exactly the same
examples and reuse each other's cached fits:

- **localization examples** come from the ``train`` split: ``n_candidates`` are drawn and scored,
  the ones the model solves come first (greedy-correct for the ``accuracy`` metric, greedy
  reproduces the whole target for ``target_prob``), then the rest by target probability, and the
  first ``n_locate`` are kept (so a model that solves few still gets a fixed-size set; the tables
  report how many were solved);
- **evaluation examples** come from the ``test`` split (held out: the two splits never share a
  record, see :func:`capinterp.data.capabilities.load_capability`);
- **scores** are fitted on two seeded disjoint halves of the localization examples, each cached
  through ``localize`` (``Context.localize``); the whole-set scores are the size-weighted mean of
  the two halves -- exactly the mean a fit on the union computes, so no third fit is needed.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from capinterp.arch.model import model_fingerprint
from capinterp.core.example import Example, as_examples
from capinterp.core.protocol import Model
from capinterp.experiments.scoring import TASK_METRICS, greedy_correct, target_scores
from capinterp.localizers.dataset import fill_greedy_targets
from capinterp.units.neurons import NeuronScores

__all__ = [
    "DEFAULT_METRIC",
    "MAX_TARGET_TOKENS",
    "QUICK_CAPABILITIES",
    "CapabilityData",
    "Localize",
    "cut_targets",
    "data_hash",
    "default_localize",
    "half_scores",
    "halves",
    "located_scores",
    "metric_for",
    "on_device",
    "pooled",
    "prepare",
    "prepared",
    "settings",
    "solved_first",
]

#: Metric per capability (see :mod:`capinterp.experiments.scoring`). Gemma 3 270M solves none of
#: the word problems (GSM8K and the builtin ones: 0 %) and no HumanEval first line exactly, so
#: those two use the mean target probability; arithmetic and sentiment use greedy accuracy.
DEFAULT_METRIC: dict[str, str] = {
    "add": "accuracy",
    "sub": "accuracy",
    "mul": "accuracy",
    "div": "accuracy",
    "sentiment": "accuracy",
    "math_word": "target_prob",
    "code": "target_prob",
}
#: The capabilities quick mode runs: one arithmetic and one language capability, both with
#: one-token answers (CNL's cost grows with the answer's tokens: every IG row unembeds each
#: answer position over Gemma's 262k vocabulary; "add" often has two-digit answers, "sub" and the
#: sentiment labels one token).
QUICK_CAPABILITIES: tuple[str, ...] = ("sub", "sentiment")
#: Targets cut to their first tokens (by capability): a code target is a whole first line
#: (~10-20 tokens), and CNL's cost grows with the number of answer tokens (each one unembeds
#: every IG row over the full vocabulary). Five tokens keep the line break, the indentation and
#: the line's first ~3 content tokens (``"\n    m = l"``).
MAX_TARGET_TOKENS: dict[str, int] = {"code": 5}

#: ``localize(method, data_name, examples, **params) -> NeuronScores`` (``Context.localize``).
Localize = Callable[..., NeuronScores]


@dataclass
class CapabilityData:
    """One capability's localization and evaluation examples and its metric."""

    name: str
    metric: str
    locate: list[Example]
    test: list[Example]
    n_solved: int = 0
    n_candidates: int = 0


def data_hash(examples: Sequence[Example]) -> str:
    """8 hex digits identifying a list of examples (prompts and targets, in order)."""
    h = hashlib.sha256()
    for e in examples:
        h.update(f"{e.prompt}\x00{e.target}\x01".encode())
    return h.hexdigest()[:8]


def metric_for(name: str) -> str:
    """The default metric of capability ``name`` (``accuracy`` for an unknown name)."""
    return DEFAULT_METRIC.get(name, "accuracy")


def solved_first(
    model: Model, examples: Sequence[Example], metric: str, n_keep: int, batch_size: int = 16
) -> tuple[list[Example], int]:
    """The ``n_keep`` examples to localize on (solved ones first, then by target probability).

    Returns the kept examples and how many of them the model solves. Prompts without a target
    get the model's greedy next token as target first (as the localizers do).
    """
    if metric not in TASK_METRICS:
        raise ValueError(f"unknown metric {metric!r}; choose one of {', '.join(TASK_METRICS)}")
    exs = fill_greedy_targets(model, as_examples(examples))
    stats = target_scores(model, exs, batch_size)
    if metric == "accuracy":
        solved = greedy_correct(model, exs, stats, batch_size)
    else:
        solved = [bool(m) for m in stats["match"]]
    order = sorted(range(len(exs)), key=lambda i: (not solved[i], -stats["prob"][i] if not solved[i] else 0.0, i))
    keep = order[:n_keep]
    return [exs[i] for i in keep], sum(solved[i] for i in keep)


def cut_targets(model: Model, examples: Sequence[Example], max_tokens: int) -> list[Example]:
    """Targets shortened to their first ``max_tokens`` tokens (in context), where that round-trips.

    An example whose shortened target would tokenize differently after its prompt, or be only
    whitespace (refused as a target everywhere, :func:`capinterp.core.example.check_target`),
    keeps its full target (none of the packaged code sets' 5-token cuts is whitespace only on
    SmolLM2 or Gemma 3). Shortened examples record ``meta["target_full"]``.
    """
    from capinterp.core.tokens import TokenizationError, encode

    out = []
    for e in examples:
        enc = encode(model, [e])[0]
        ids = enc.prompt_ids[len(enc.prompt_ids) - enc.context_ws :] + enc.target_ids  # with its leading whitespace
        if len(ids) <= max_tokens + enc.context_ws:
            out.append(e)
            continue
        cut_ids = ids[: max_tokens + enc.context_ws]
        cut = Example(e.prompt, model.tokenizer.decode(cut_ids), {**e.meta, "target_full": e.target})
        try:
            ok = encode(model, [cut])[0].target_ids == cut_ids[enc.context_ws :]
        except TokenizationError:
            ok = False
        out.append(cut if ok else e)
    return out


_MEMO: dict[tuple, CapabilityData] = {}


def prepare(
    model: Model,
    names: Sequence[str],
    *,
    n_candidates: int,
    n_locate: int,
    n_test: int,
    seed: int = 0,
    metrics: dict[str, str] | None = None,
    batch_size: int = 16,
    loader: Callable[..., list[Example]] | None = None,
) -> dict[str, CapabilityData]:
    """Load and rank each capability's examples (memoized per model and settings in this process).

    ``loader(name, n, seed=, split=)`` defaults to :func:`capinterp.data.capabilities.load_capability`.
    Targets of the capabilities in :data:`MAX_TARGET_TOKENS` are shortened (:func:`cut_targets`).
    """
    if loader is None:
        from capinterp.data.capabilities import load_capability

        loader = load_capability
    out: dict[str, CapabilityData] = {}
    for name in names:
        metric = (metrics or {}).get(name, metric_for(name))
        memo_key = (
            id(model),
            model_fingerprint(model),
            name,
            metric,
            n_candidates,
            n_locate,
            n_test,
            seed,
            getattr(loader, "__qualname__", repr(loader)),
        )
        if memo_key not in _MEMO:
            cands = loader(name, n_candidates, seed=seed, split="train")
            test = fill_greedy_targets(model, loader(name, n_test, seed=seed, split="test"))
            if name in MAX_TARGET_TOKENS:
                cands = cut_targets(model, fill_greedy_targets(model, cands), MAX_TARGET_TOKENS[name])
                test = cut_targets(model, test, MAX_TARGET_TOKENS[name])
            locate, n_solved = solved_first(model, cands, metric, n_locate, batch_size)
            _MEMO[memo_key] = CapabilityData(name, metric, locate, test, n_solved, len(cands))
        out[name] = _MEMO[memo_key]
    return out


def halves(examples: Sequence[Example], seed: int = 0) -> tuple[list[Example], list[Example]]:
    """Two disjoint seeded random halves of equal size (an odd last example is left out)."""
    if len(examples) < 2:
        raise ValueError(f"splitting in halves needs at least 2 examples, got {len(examples)}")
    order = list(range(len(examples)))
    random.Random(seed).shuffle(order)
    h = len(order) // 2
    return [examples[i] for i in order[:h]], [examples[i] for i in order[h : 2 * h]]


def half_scores(
    localize: Localize, method: str, name: str, examples: Sequence[Example], seed: int = 0, **params: Any
) -> tuple[NeuronScores, NeuronScores]:
    """Scores of ``method`` fitted on each half of ``examples`` (each fit cached by ``localize``)."""
    a, b = halves(examples, seed)
    return (
        localize(method, f"{name}-{data_hash(a)}", a, **params),
        localize(method, f"{name}-{data_hash(b)}", b, **params),
    )


def pooled(a: NeuronScores, b: NeuronScores, n_a: int, n_b: int) -> NeuronScores:
    """The size-weighted mean of two halves' scores = the scores of a fit on their union."""
    meta = {**a.meta, "n_samples": n_a + n_b, "pooled_from_halves": [n_a, n_b]}
    return NeuronScores((a.scores.double() * n_a + b.scores.double() * n_b) / (n_a + n_b), meta=meta)


def located_scores(localize: Localize, method: str, data: CapabilityData, seed: int = 0, **params: Any) -> NeuronScores:
    """Whole-set scores of one capability, from the two cached half fits (shared with commonality)."""
    a, b = half_scores(localize, method, data.name, data.locate, seed, **params)
    n = len(data.locate) // 2
    return pooled(a, b, n, n)


def settings(ctx: Any) -> dict[str, Any]:
    """Sizes and hyper-parameters shared by the three capability experiments (quick / full).

    Quick: :data:`QUICK_CAPABILITIES`, 6 examples per half (best 12 of 16 candidates), CNL with
    4 IG steps, 12 test examples. Full: every capability, 12 per half (of 48), 6 IG steps, 32 test
    examples. CNL's cost is proportional to steps x answer tokens. The CNL parameters are part of
    the fits' cache key, so all three experiments share one fit per half.
    """
    from capinterp.data.capabilities import CAPABILITIES

    return {
        "capabilities": tuple(QUICK_CAPABILITIES if ctx.quick else CAPABILITIES),
        "n_candidates": ctx.size(16, 48),
        "n_locate": ctx.size(12, 24),
        "n_test": ctx.size(12, 32),
        "params": {"cnl": _cnl_params(ctx), "dcsn": {}},
    }


def _cnl_params(ctx: Any) -> dict[str, Any]:
    """CNL's IG settings; the papers' rule is left out of the cache key (older caches stay valid)."""
    ig = ctx.ig(4, 6) if hasattr(ctx, "ig") else {"rule": "right", "steps": ctx.size(4, 6)}
    return {"steps": ig["steps"]} if ig["rule"] == "right" else ig


def prepared(ctx: Any, s: dict[str, Any]) -> dict[str, CapabilityData]:
    """The capabilities' data for settings ``s`` (memoized, so the experiments share it)."""
    return prepare(
        ctx.model,
        s["capabilities"],
        n_candidates=s["n_candidates"],
        n_locate=s["n_locate"],
        n_test=s["n_test"],
        seed=ctx.seed,
        batch_size=ctx.batch_size,
    )


def default_localize(model: Model) -> Localize:
    """An uncached ``localize`` (a fresh fit per call), for use outside a reproduction run."""
    from capinterp.experiments.base import Context

    return Context(model, progress=False).localize


def on_device(model: Model, device: Any) -> Any:
    """Move ``model`` to ``device`` when one is given (the localizers' convention); return it."""
    from capinterp.arch.model import move_model

    move_model(model, device)
    return model
