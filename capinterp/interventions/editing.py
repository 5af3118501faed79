"""Edit a fact through its knowledge neurons' value vectors (Dai et al. 2022, Sec. 5; Chen et al. 2025, Sec. 4; docs/interventions.md).

A neuron (l, i)'s *value vector* v is what it writes into the residual stream: row i of
``W_out[l]`` (``[d_mlp, d_model]``; input i of the HF down projection, a column of an ``nn.Linear``,
a row of GPT-2's ``Conv1D``; on a mixture-of-experts layer, its expert's down-projection entry:
:func:`capinterp.arch.weights.down_projection`). Two edits:

- ``mode="erase"``:  v <- 0;
- ``mode="update"``: v <- v + s * (-lambda1 * e(y_old) + lambda2 * e(y_new)), with
  lambda_k = param_k * ||v|| / ||e|| (Dai et al.; params 1 and 8), e(y) the answer's first token's
  unembedding column (``direction="unembed"``, default) or embedding row (``"embed"``), and
  s = the sign of the neuron's activation at the edited query's last token (``signed=True``,
  default): gated (SiLU/GELU-gated) neurons fire negative as often as positive, and a neuron
  that fires negative writes -v, so Dai's unsigned rule (``signed=False``, s = 1) would push it
  towards the old answer.

The neurons come from :class:`~capinterp.localizers.query_localization.QueryLocalization`:
``"consistency-aware"`` (CAS), ``"query"`` (the edited query's own KNs, N_i) or ``"union"`` (N_g).
Metrics (:func:`edit_knowledge`): reliability on the edited query, generalization on its
paraphrases, locality on unrelated prompts, their mean, and the perplexity change on neutral text.

The caller's model is left as it was unless ``inplace=True``: metrics are measured inside
:meth:`KnowledgeEdit.apply`, a context manager that writes the new value vectors and restores
the exact old ones on exit (also after an exception); :meth:`KnowledgeEdit.edited_copy` gives a
deep copy with the edit kept.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from capinterp.arch.experts import latent_layers
from capinterp.arch.family import UnsupportedFamily, family_of
from capinterp.arch.model import neuron_hook
from capinterp.arch.weights import down_projection, value_weight
from capinterp.core import validate
from capinterp.core.example import Example, TokenizationError, as_examples
from capinterp.core.fingerprint import restoring
from capinterp.core.params import copy_model
from capinterp.core.protocol import Model
from capinterp.core.tokens import Encoded, encode
from capinterp.interventions.configs import EditConfig, with_overrides
from capinterp.interventions.edit_eval import EditBaseline, measure_edit, next_token_probs, perplexity, probe_ids
from capinterp.interventions.hooks import check_neurons
from capinterp.localizers.query_localization import NEURON_SELECTIONS, QueryLocalization, as_facts
from capinterp.units.neurons import NeuronSet

__all__ = [
    "EDIT_SELECTIONS",
    "MODES",
    "EditBaseline",
    "EditConfig",
    "KnowledgeEdit",
    "edit_knowledge",
    "edit_table",
    "new_values",
    "value_weight",
]

#: The neuron selections :func:`edit_table` compares by default (``"intersection"`` is accepted too).
EDIT_SELECTIONS = ("consistency-aware", "query", "union")
MODES = ("erase", "update")


def _rows(model: Model, layer: int, idx: torch.Tensor) -> torch.Tensor:
    """Copies of the value vectors of neurons ``idx`` of ``layer``: ``[k, d_model]``."""
    values = down_projection(model, layer).values()
    return values.detach()[idx.to(values.device)].clone()


@torch.no_grad()
def _write(model: Model, layer: int, idx: torch.Tensor, values: torch.Tensor) -> None:
    down_projection(model, layer).write_rows(idx, values)


def _no_latent(model: Model, what: str, layers: Any = None) -> None:
    """Refuse ``what`` (writing new value vectors) where the routed experts of ``layers`` (every layer by
    default) work in a latent space, before anything is written."""
    latent = [l for l in latent_layers(model) if layers is None or l in layers]
    if latent:
        fam = family_of(model)
        raise UnsupportedFamily(
            f"{fam.name} ({fam.architecture}): {what} writes new value vectors, and the routed experts of "
            f"layers {latent} work in a latent space (a value vector is fc2_latent_proj @ the expert's own column, "
            "so a d_model vector is in reach only within fc2's range); erase the neurons instead (capinterp.erase)"
        )


@dataclass
class KnowledgeEdit:
    """One edit: which neurons get which value vectors, and what it did (``metrics``, ``records``)."""

    selection: str
    mode: str
    neurons: NeuronSet
    values: dict[int, tuple[torch.Tensor, torch.Tensor]]  # layer -> (neuron indices, new rows [k, d_model])
    old_target: str
    new_target: str | None = None
    params: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    records: pd.DataFrame | None = None
    model: Model | None = None  # the edited model when inplace=True

    @contextlib.contextmanager
    def apply(self, model: Model) -> Iterator[Any]:
        """Write the new value vectors into ``model``; restore the exact old ones on exit."""
        check_neurons(model, self.neurons)
        _no_latent(model, "a knowledge edit", self.values)
        saved = {l: _rows(model, l, idx) for l, (idx, _) in self.values.items()}
        with restoring(model):  # the old rows go back exactly: the fingerprint stays valid
            try:
                for l, (idx, new) in self.values.items():
                    _write(model, l, idx, new)
                yield model
            finally:
                for l, (idx, _) in self.values.items():
                    _write(model, l, idx, saved[l])

    def apply_permanently(self, model: Model) -> Any:
        """Write the edit into ``model`` for good; returns the model."""
        check_neurons(model, self.neurons)
        _no_latent(model, "a knowledge edit", self.values)
        for l, (idx, new) in self.values.items():
            _write(model, l, idx, new)
        return model

    def edited_copy(self, model: Model) -> Any:
        """A deep copy of ``model`` with the edit kept (``model`` itself is not touched)."""
        return self.apply_permanently(copy_model(model))


def _direction(model: Model, token: int, direction: str) -> torch.Tensor:
    return (model.W_U[:, token] if direction == "unembed" else model.W_E[token]).detach().float()


@torch.no_grad()
def last_activations(model: Model, ids: Sequence[int], neurons: NeuronSet) -> Float[Tensor, "n_layers d_mlp"]:
    """Activations ``[n_layers, d_mlp]`` at the last position of ``ids`` (layers with neurons only)."""
    acts = torch.zeros(neurons.shape)
    layers = [l for l in range(neurons.n_layers) if bool(neurons.mask[l].any())]

    def grab(a: torch.Tensor, hook) -> None:
        acts[int(hook.name.split(".")[1])] = a[0, -1].float().cpu()

    if layers:
        model.run_with_hooks(
            torch.tensor([list(ids)], device=model.cfg.device), fwd_hooks=[(neuron_hook(l), grab) for l in layers]
        )
    return acts


def new_values(
    model: Model,
    neurons: NeuronSet,
    mode: str,
    old_token: int | None = None,
    new_token: int | None = None,
    lambdas: tuple[float, float] = (1.0, 8.0),
    direction: str = "unembed",
    signs: Float[Tensor, "n_layers d_mlp"] | None = None,
):
    """Per layer ``(indices, new value rows)``: zeros (erase) or Dai's update of every row.

    ``signs`` (``[n_layers, d_mlp]``, +-1) flips the update of neurons that fire negative.
    """
    out = {}
    for layer in range(neurons.n_layers):
        idx = neurons.mask[layer].nonzero().flatten()
        if idx.numel() == 0:
            continue
        v = _rows(model, layer, idx).float()
        if mode == "erase":
            out[layer] = (idx, torch.zeros_like(v))
            continue
        if old_token is None or new_token is None:
            raise ValueError("mode='update' needs the old and the new answer's first tokens")
        e_old, e_new = (_direction(model, t, direction).to(v.device) for t in (old_token, new_token))
        norm = v.norm(dim=1, keepdim=True)
        sign = signs[layer, idx.cpu()].to(v)[:, None] if signs is not None else 1.0
        v = v + sign * (lambdas[1] * norm * e_new / e_new.norm() - lambdas[0] * norm * e_old / e_old.norm())
        out[layer] = (idx, v)
    return out


def _check_args(selection: str, mode: str) -> None:
    if selection not in NEURON_SELECTIONS:
        raise ValueError(f"unknown selection {selection!r}; choose one of {', '.join(NEURON_SELECTIONS)}")
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; choose one of {', '.join(MODES)}")


def _spaced(new_target: str, old_target: str) -> str:
    """Give the new answer the old answer's leading whitespace (``"Rome"`` -> ``" Rome"``)."""
    lead = old_target[: len(old_target) - len(old_target.lstrip())]
    return new_target if new_target[:1].isspace() or not lead else lead + new_target


def _the_fact(fact: Sequence[Any], query_index: int, min_queries: int) -> tuple[list[Example], int]:
    """The fact's queries (at least ``min_queries``) and ``query_index`` made non-negative."""
    _, (queries,) = as_facts([fact], min_queries=min_queries)
    if not -len(queries) <= query_index < len(queries):
        raise ValueError(f"query_index {query_index} out of range for a fact with {len(queries)} queries")
    return queries, query_index % len(queries)


def _new_answer(mode: str, new_target: str | None, old: str) -> str | None:
    """``new_target`` checked against ``mode`` and spaced like the old answer (update only)."""
    if mode == "update":
        if not isinstance(new_target, str):
            raise ValueError("mode='update' needs new_target, the new answer (e.g. ' Rome')")
        if not new_target.strip():
            raise TokenizationError(
                f"new_target is an empty target ({new_target!r}); give the new answer (e.g. ' Rome')"
            )
        return _spaced(new_target, old)
    if new_target is not None:
        raise ValueError("new_target is only used with mode='update'")
    return new_target


def _answer_ids(
    model: Model, queries: list[Example], query_index: int, mode: str, new_target: str | None
) -> tuple[list[Encoded], list[int] | None]:
    """The queries encoded with their old answer, and the new answer's first token per query
    (update only; refused when it is the old answer's first token)."""
    enc = encode(model, queries, max_target_tokens=1)
    new_ids = (
        [
            e.target_ids[0]
            for e in encode(model, [Example(q.prompt, new_target or "") for q in queries], max_target_tokens=1)
        ]
        if mode == "update"
        else None
    )
    if new_ids is not None and new_ids[query_index] == enc[query_index].target_ids[0]:
        raise ValueError(
            f"new_target {new_target!r} starts with the same token as the old answer {queries[0].target!r}"
        )
    return enc, new_ids


def _fact_neurons(
    model: Model,
    queries: list[Example],
    query_index: int,
    selection: str,
    neurons: NeuronSet | None,
    ql: QueryLocalization | None,
    ql_params: dict[str, Any],
) -> NeuronSet:
    """The edited neurons: ``neurons`` (checked against the model), ``ql``'s selection for this fact,
    or those of a fresh QueryLocalization on the fact (on the edited query alone for ``"query"``)."""
    if neurons is not None:
        check_neurons(model, neurons)
        return neurons
    if ql is not None:
        return ql.neurons(ql.index_of(queries), selection, query_index)
    qs = [queries[query_index]] if selection == "query" else queries
    loc = QueryLocalization(model, min_queries=1, progress=False, **ql_params).fit([qs])
    return loc.neurons(0, selection, 0 if selection == "query" else query_index)


#: The :class:`~capinterp.interventions.configs.EditConfig` fields that set the update rule (what
#: :func:`edit_table` takes as keyword overrides; its other keywords configure the QueryLocalization).
_RULE_FIELDS = ("lambdas", "direction", "signed")


def _split(config: EditConfig | None, params: dict[str, Any], names: Sequence[str], where: str):
    """``(config with the overrides among params named in names, the other params)``."""
    overrides = {k: params.pop(k) for k in list(params) if k in names}
    return with_overrides(EditConfig, config, overrides, where), params


@dataclass(frozen=True)
class _EditPlan:
    """What :func:`edit_knowledge` settled before any attribution: the fact's queries (encoded with
    the old answer), the edited query, the old and new answers (and the new answer's first token per
    query), the unrelated prompts, the neutral texts and the unedited measurements."""

    queries: list[Example]
    query_index: int
    old: str
    new_target: str | None
    enc: list[Encoded]
    new_ids: list[int] | None
    others: list[Example]
    texts: list[str]
    baseline: EditBaseline


def _check_baseline(baseline: Any) -> EditBaseline:
    baseline = EditBaseline() if baseline is None else baseline
    if not isinstance(baseline, EditBaseline):
        raise TypeError(f"baseline must be an EditBaseline or None, got {type(baseline).__name__}")
    if baseline.ppl is not None:
        validate.finite_float("baseline.ppl", baseline.ppl, low=1.0)
    return baseline


def _plan_edit(
    model: Model,
    fact: Sequence[Any],
    selection: str,
    mode: str,
    new_target: str | None,
    query_index: Any,
    localize: bool,
    unrelated: Sequence[Any] | None,
    neutral_text: str | Sequence[str] | None,
    baseline: Any,
) -> _EditPlan:
    """Every check of :func:`edit_knowledge`'s data before any attribution (``localize``: the neurons
    come from a fresh QueryLocalization, which needs two queries unless the selection is ``"query"``)."""
    validate.model(model)
    _no_latent(model, "edit_knowledge")  # before any localization
    query_index = validate.integer("query_index", query_index)
    baseline = _check_baseline(baseline)
    queries, query_index = _the_fact(fact, query_index, 2 if localize and selection != "query" else 1)
    old = queries[0].target
    new_target = _new_answer(mode, new_target, old)
    enc, new_ids = _answer_ids(model, queries, query_index, mode, new_target)
    others = as_examples(unrelated or [])
    texts = [neutral_text] if isinstance(neutral_text, str) else list(neutral_text or [])
    return _EditPlan(queries, query_index, old, new_target, enc, new_ids, others, texts, baseline)


def _edit_values(
    model: Model, plan: _EditPlan, selection: str, mode: str, neurons: NeuronSet, cfg: EditConfig
) -> KnowledgeEdit:
    """The :class:`KnowledgeEdit` of ``neurons``: their new value vectors by ``cfg``'s rule (signs read
    at the edited query for a signed update)."""
    q = plan.query_index
    signs = None
    if mode == "update" and cfg.signed:
        acts = last_activations(model, plan.enc[q].prompt_ids, neurons)
        signs = torch.where(acts < 0, -1.0, 1.0)
    lambdas = (float(cfg.lambdas[0]), float(cfg.lambdas[1]))
    new_id = plan.new_ids[q] if plan.new_ids else None
    values = new_values(model, neurons, mode, plan.enc[q].target_ids[0], new_id, lambdas, cfg.direction, signs)
    params = {
        "query_index": q,
        "lambdas": list(cfg.lambdas),
        "direction": cfg.direction,
        "signed": bool(cfg.signed) if mode == "update" else None,
    }
    return KnowledgeEdit(selection, mode, neurons, values, plan.old, plan.new_target, params)


def edit_knowledge(
    model: Model,
    fact: Sequence[Any],
    selection: str = "consistency-aware",
    mode: str = "erase",
    new_target: str | None = None,
    *,
    neurons: NeuronSet | None = None,
    ql: QueryLocalization | None = None,
    query_index: int = 0,
    unrelated: Sequence[Any] | None = None,
    neutral_text: str | Sequence[str] | None = None,
    config: EditConfig | None = None,
    inplace: bool = False,
    evaluate: bool = True,
    baseline: EditBaseline | None = None,
    **params: Any,
) -> KnowledgeEdit:
    """Erase or update one fact through its knowledge neurons and measure the edit.

    Args:
        model: the model to edit (left unchanged unless ``inplace=True``).
        fact: the fact's paraphrased queries (one answer).
        selection: which neurons: ``"consistency-aware"``, ``"query"`` or ``"union"`` (also
            ``"intersection"``), as :meth:`QueryLocalization.neurons` picks them.
        mode: ``"erase"`` or ``"update"``.
        new_target: the new answer for ``"update"`` (spaced like the old answer: ``"Rome"`` gets
            the old answer's leading space).
        neurons: edit these neurons instead of localizing.
        ql: a fitted QueryLocalization that holds this fact (no new attribution runs). Without
            ``neurons`` or ``ql`` one is fitted on the fact with the QueryLocalization parameters
            among ``params``.
        query_index: the edited query, ``fact[query_index]``; the others are its paraphrases.
        unrelated: prompts (Examples or strings) of unrelated facts, for locality.
        neutral_text: text(s) for the perplexity change.
        config: the update rule and the measuring batch size, an
            :class:`~capinterp.interventions.configs.EditConfig` (default ``EditConfig()``:
            :data:`~capinterp.interventions.configs.EDIT_SIGNED`).
        inplace: keep the edit in ``model``; otherwise ``model`` ends exactly as it started.
        evaluate: measure metrics (otherwise ``metrics`` stays empty).
        baseline: the unedited model's perplexity on ``neutral_text`` and next-token probabilities,
            where already measured (:func:`edit_table` reuses them across selections and modes).
        params: fields of :class:`~capinterp.interventions.configs.EditConfig` (``lambdas``,
            ``direction``, ``signed``, ``batch_size``), applied on top of ``config``; any other
            keyword is a QueryLocalization / KN parameter for a fresh localization (e.g. ``steps=20``).

    Metrics: ``reliability`` (erase: the edited query's top-1 is no longer the old answer; update:
    it is the new answer), ``generalization`` (the same over the paraphrases), ``locality`` (share of
    unrelated prompts whose top-1 token is unchanged), ``avg`` (their mean), ``ppl_before``,
    ``ppl_after``, ``delta_ppl``, ``rel_prob`` / ``gen_prob`` (erase: relative drop of p(old answer);
    update: p(new answer) after), ``n_neurons``. Every input error is raised before any attribution.
    """
    cfg, ql_params = _split(config, params, [f.name for f in fields(EditConfig)], "edit_knowledge")
    _check_args(selection, mode)
    for flag, value in (("inplace", inplace), ("evaluate", evaluate)):
        validate.boolean(flag, value)
    if ql_params and (neurons is not None or ql is not None):
        raise ValueError(f"parameters {sorted(ql_params)} configure a new localization, but neurons or ql are given")
    localize = neurons is None and ql is None
    plan = _plan_edit(
        model, fact, selection, mode, new_target, query_index, localize, unrelated, neutral_text, baseline
    )
    neurons = _fact_neurons(model, plan.queries, plan.query_index, selection, neurons, ql, ql_params)
    edit = _edit_values(model, plan, selection, mode, neurons, cfg)
    if evaluate:
        measure_edit(model, edit, plan.enc, plan.new_ids, plan.others, plan.texts, cfg.batch_size, plan.baseline)
    if inplace:
        edit.apply_permanently(model)
        edit.model = model
    return edit


def _other_facts(answers: list[str]) -> list[list[int]]:
    """Per fact, the other facts with another answer, in cyclic order from the next one."""
    n = len(answers)
    order = [[(k + j) % n for j in range(1, n)] for k in range(n)]
    return [[j for j in order[k] if answers[j].strip() != answers[k].strip()] for k in range(n)]


def _table_ql(
    model: Model, names: Sequence[Any], groups: list[list[Example]], ql: QueryLocalization | None, ql_params: dict
) -> QueryLocalization:
    """``ql`` checked to hold ``groups``, or a QueryLocalization fitted on them with ``ql_params``."""
    if ql is None:
        return QueryLocalization(model, **ql_params).fit(dict(zip(names, groups)))
    if ql_params:
        raise ValueError(f"parameters {sorted(ql_params)} configure a QueryLocalization, but ql is already fitted")
    if len(ql.names_) != len(groups) or (
        ql.facts_ is not None and any([q.prompt for q in f] != [q.prompt for q in g] for f, g in zip(ql.facts_, groups))
    ):
        raise ValueError("ql was fitted on other facts than those given")
    return ql


def _check_table(selections: tuple[str, ...], modes: Sequence[str], n_facts: int, new_targets, others) -> None:
    """:func:`edit_table`'s selections, modes and new answers, checked before any localization."""
    if not selections or not modes:
        raise ValueError("edit_table needs at least one selection and one mode")
    for m in selections:
        _check_args(m, "erase")
    for mode in modes:
        _check_args("query", mode)
    if new_targets is not None and len(new_targets) != n_facts:
        raise ValueError(f"new_targets has {len(new_targets)} entries for {n_facts} facts")
    if "update" in modes and new_targets is None and any(not o for o in others):
        raise ValueError("mode 'update' needs new_targets, or facts with at least two different answers")


def _fact_rows(
    model: Model,
    ql: QueryLocalization,
    k: int,
    name: Any,
    queries: list[Example],
    selections: tuple[str, ...],
    modes: Sequence[str],
    new: str | None,
    ppl0: float | None,
    run: dict[str, Any],
) -> list[dict[str, Any]]:
    """One fact's rows of :func:`edit_table`: its metrics for every mode and selection, the unedited
    next-token probabilities measured once for them all."""
    before = next_token_probs(model, probe_ids(model, encode(model, queries, max_target_tokens=1), run["unrelated"]))
    rows = []
    for mode in modes:
        for selection in selections:
            neurons = ql.neurons(k, selection, run["query_index"])
            new_target = new if mode == "update" else None
            baseline = EditBaseline(ppl0, before)
            e = edit_knowledge(model, queries, selection, mode, new_target, neurons=neurons, baseline=baseline, **run)
            rows.append({"fact": name, "mode": mode, "selection": selection, **e.metrics})
    return rows


def _table_frame(rows: list[dict[str, Any]], per_fact: bool) -> pd.DataFrame | tuple[pd.DataFrame, pd.DataFrame]:
    """Mean metrics per (mode, selection), the median perplexity change and ``n_facts``."""
    raw = pd.DataFrame(rows)
    cols = ["reliability", "generalization", "locality", "avg", "rel_prob", "gen_prob", "delta_ppl", "n_neurons"]
    groups_ = raw.groupby(["mode", "selection"], sort=False)
    table = groups_[cols].mean()
    table["delta_ppl_median"] = groups_["delta_ppl"].median()
    table["n_facts"] = groups_.size()
    table = table.reset_index()
    return (table, raw) if per_fact else table


def edit_table(
    model: Model,
    facts: Any,
    *,
    ql: QueryLocalization | None = None,
    selections: Sequence[str] = EDIT_SELECTIONS,
    modes: Sequence[str] = ("erase", "update"),
    new_targets: Sequence[str] | None = None,
    n_unrelated: int = 10,
    unrelated: Sequence[Any] | None = None,
    neutral_text: str | Sequence[str] | None = None,
    query_index: int = 0,
    config: EditConfig | None = None,
    per_fact: bool = False,
    **params: Any,
) -> pd.DataFrame | tuple[pd.DataFrame, pd.DataFrame]:
    """Edit every fact with every neuron selection and mode; mean metrics per (mode, selection).

    Columns are means over facts of the :func:`edit_knowledge` metrics (``delta_ppl_median``: the
    median, robust to the few edits that wreck the model) and ``n_facts``.

    Args:
        model: the model (left unchanged).
        facts: a list of facts (lists of paraphrased queries) or a mapping name -> fact.
        ql: a QueryLocalization fitted on ``facts``; fitted here with the other ``params`` if missing.
        selections: neuron sets to compare (consistency-aware, query-level, fact-union).
        modes: ``"erase"`` and / or ``"update"``.
        new_targets: one new answer per fact; default: the answer of the next fact (cyclically)
            with another answer.
        n_unrelated: unrelated prompts per fact: the first queries of the next facts with another answer.
        unrelated: prompts used as the unrelated set of every fact instead (e.g. other relations).
        neutral_text: text(s) for the perplexity change.
        query_index: the edited query of every fact.
        config: every edit's :class:`~capinterp.interventions.configs.EditConfig` (see :func:`edit_knowledge`).
        per_fact: also return the frame with one row per edit.
        params: ``lambdas``, ``direction`` and ``signed`` override those of ``config``; every other
            keyword (``batch_size`` included) is a parameter of the QueryLocalization fitted when
            ``ql`` is missing.
    """
    cfg, ql_params = _split(config, params, _RULE_FIELDS, "edit_table")
    selections = tuple(selections)
    names, groups = as_facts(facts, min_queries=2)
    answers = [g[0].target for g in groups]
    others = _other_facts(answers)
    _check_table(selections, modes, len(groups), new_targets, others)
    ql = _table_ql(model, names, groups, ql, ql_params)
    fixed = as_examples(unrelated) if unrelated is not None else None
    texts = [neutral_text] if isinstance(neutral_text, str) else list(neutral_text or [])
    ppl0 = perplexity(model, texts) if texts else None
    rows = []
    for k, (name, g) in enumerate(zip(names, groups)):
        unrel = fixed if fixed is not None else [groups[j][0] for j in others[k][:n_unrelated]]
        new = new_targets[k] if new_targets is not None else answers[others[k][0]] if others[k] else None
        run = dict(query_index=query_index, unrelated=unrel, neutral_text=texts, config=cfg)
        rows += _fact_rows(model, ql, k, name, g, selections, modes, new, ppl0, run)
    return _table_frame(rows, per_fact)
