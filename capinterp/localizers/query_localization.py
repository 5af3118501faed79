"""Query Localization (Chen et al., ICLR 2025, Sec. 3; docs/query_localization.md): are a fact's knowledge
neurons the same for every paraphrase of it?

A *fact* is a group of paraphrased queries q_1..q_n with one answer. A per-query localizer (KN,
integrated gradients at the last prompt token) gives every query its score map s_i and its
neuron set N_i (positive scores above ``t * max``, KN's coarse threshold). Then, per fact:

- CS1 = |∩_i N_i| / |∪_i N_i|                     (strict consistency)
- CS2 = mean_{i<j} |N_i ∩ N_j| / |N_i ∪ N_j|      (relaxed: mean pairwise Jaccard; reconstruction (R))
- the fact is *consistent* (K_I) when CS >= tau, else *inconsistent* (K_II); tau is static (0.3)
  or Otsu's threshold over all facts' scores (both are always reported; with ``tau="otsu"`` the
  static classes use 0.3);
- consistency-aware scores (Eq. 7, reconstruction (R)): CAS(u) = beta1 * mean_i s_i(u) - beta2 * std_i s_i(u),
  each s_i first divided by its own max (``normalize=True``); the selected neurons are those with
  CAS > ``cas_threshold * max CAS`` (positive only), KN's relative threshold again.

    ql = ci.QueryLocalization(model, localizer="kn", steps=20).fit(facts)
    ql.consistency_          # one row per fact: cs1, cs2, class (consistent / inconsistent)
    ql.summary()             # share of inconsistent facts (static tau and Otsu)
    ql.plot()                # distribution of the consistency score (plotly)
    ql.neurons(0, "consistency-aware")    # or "query" (with query=i), "union", "intersection"
"""

from __future__ import annotations

import warnings
from collections.abc import Hashable, Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from capinterp.arch.model import model_meta, neuron_shape
from capinterp.core import distributed as dist
from capinterp.core import validate
from capinterp.core.constraints import NO_VALIDATION, InstanceOf, Interval, Options, check_value, validates_params
from capinterp.core.example import Example, TokenizationError, as_examples
from capinterp.core.protocol import Model
from capinterp.core.tokens import encode
from capinterp.kernels.completeness import CompletenessWarning, merge_reports, warn_report, worst_layers
from capinterp.localizers.base import Localizer, available, get
from capinterp.localizers.kn import coarse_mask
from capinterp.units.metrics import consistency, otsu_threshold
from capinterp.units.neurons import NeuronScores, NeuronSet

__all__ = ["NEURON_SELECTIONS", "QueryLocalization", "as_facts", "consistency_aware_scores"]

#: Rules that pick a fact's neurons in :meth:`QueryLocalization.neurons` (its ``selection``).
NEURON_SELECTIONS = ("consistency-aware", "query", "union", "intersection")
SCORES = ("cs1", "cs2")


def as_facts(facts: Any, *, min_queries: int = 1) -> tuple[list[Hashable], list[list[Example]]]:
    """Validate facts and return ``(names, facts)``; every problem is a ValueError raised here.

    ``facts`` is a list of facts or a mapping name -> fact; a fact is a non-empty sequence of
    queries (Examples, ``(prompt, target)`` pairs or dicts) that share one answer (targets equal
    up to surrounding whitespace) and has at least ``min_queries`` queries.
    """
    if isinstance(facts, Mapping):
        names, groups = list(facts.keys()), list(facts.values())
    elif isinstance(facts, Sequence) and not isinstance(facts, (str, Example)):
        names, groups = list(range(len(facts))), list(facts)
    else:
        raise ValueError(f"facts must be a list of facts or a mapping name -> fact, got {type(facts).__name__}")
    if not groups:
        raise ValueError("no facts given: facts must hold at least one group of paraphrased queries")
    out: list[list[Example]] = []
    for name, group in zip(names, groups):
        if isinstance(group, (str, Example, dict)) or not isinstance(group, Sequence):
            raise ValueError(
                f"fact {name!r} is a single {type(group).__name__}; a fact is a list of paraphrased queries "
                "(pass [fact] for one fact)"
            )
        queries = as_examples(group)
        if len(queries) < max(1, min_queries):
            raise ValueError(
                f"fact {name!r} has {len(queries)} queries; at least {max(1, min_queries)} are needed"
                + (" (consistency compares paraphrases)" if min_queries >= 2 else "")
            )
        answers = {q.target.strip() for q in queries}
        if "" in answers:
            raise TokenizationError(  # a bare prompt: the greedy token is no fact's answer
                f"fact {name!r} has a query with an empty target (a bare prompt); every query needs the answer"
            )
        if len(answers) != 1:
            raise ValueError(f"fact {name!r} mixes answers {sorted(answers)}; a fact has one answer")
        out.append(queries)
    return names, out


def consistency_aware_scores(
    query_scores: torch.Tensor, beta1: float = 1.0, beta2: float = 1.0, normalize: bool = True
) -> torch.Tensor:
    """CAS = beta1 * mean_i s_i - beta2 * std_i s_i over the queries (dim 0; population std).

    ``query_scores`` is ``[n_queries, n_layers, d_mlp]``. With ``normalize`` each query's map is
    divided by its largest positive score first, so every paraphrase weighs the same whatever its
    answer probability (the coarse sets use the same relative scale).
    """
    s = query_scores.double()
    if s.ndim != 3 or s.shape[0] < 1:
        raise ValueError(f"query_scores must be [n_queries, n_layers, d_mlp], got {tuple(s.shape)}")
    if normalize:
        top = s.flatten(1).max(dim=1).values.clamp_min(0)
        scale = torch.where(top > 0, top, s.flatten(1).abs().max(dim=1).values.clamp_min(1e-30))
        s = s / scale[:, None, None]
    return (beta1 * s.mean(0) - beta2 * s.std(0, correction=0)).float()


class QueryLocalization:
    """Per-query knowledge neurons of paraphrased facts, their consistency, and CAS neurons.

    Args:
        model: a loaded model (``capinterp.load_model``).
        localizer: name of a per-query localizer in :mod:`capinterp.localizers` (``"kn"``), or a
            constructed one; it must expose ``prompt_scores_`` (``[n, L, d_mlp]``) after ``fit``.
        tau: the class threshold: a static value (0.3, the paper's example value) or ``"otsu"``.
            Both classes are always in ``consistency_``; ``tau`` picks the one in its ``class`` column.
        score: which consistency score decides the class: ``"cs2"`` (relaxed, default) or ``"cs1"``.
        beta1: CAS weight of the mean attribution over queries (1).
        beta2: CAS weight of its spread, the population std over queries (1).
        cas_threshold: CAS neurons = CAS > cas_threshold * max CAS (0.2, KN's coarse ratio).
        normalize: divide each query's scores by its max before CAS (True).
        min_queries: queries a fact needs (2: consistency compares paraphrases).
        device: ``fit`` moves the model there (as for every localizer).
        batch_size: IG rows per chunk, passed to the localizer.
        progress: a progress bar over queries during :meth:`fit`.
        localizer_params: passed to the localizer (KN: ``steps=20``, ``threshold=0.2`` for the
            per-query coarse sets N_i ...).
    """

    _parameter_constraints: ClassVar[dict[str, list[Any]]] = {
        "localizer": [InstanceOf((str, Localizer), "a localizer name or a Localizer")],
        "tau": [Interval(float, 0, 1), "otsu"],
        "score": [Options(*SCORES)],
        "beta1": [Interval(float, 0, None)],
        "beta2": [Interval(float, 0, None)],
        "cas_threshold": [Interval(float, 0, 1, closed="left")],
        "normalize": [NO_VALIDATION],  # any value, as a bool
        "min_queries": [Interval(int, 1, None)],
        "device": [NO_VALIDATION],  # the localizer's (it checks it)
        "batch_size": [Interval(int, 1, None)],
        "progress": [NO_VALIDATION],  # any value, as a bool
    }

    @validates_params
    def __init__(
        self,
        model: Model,
        localizer: str | Localizer = "kn",
        *,
        tau: float | str = 0.3,
        score: str = "cs2",
        beta1: float = 1.0,
        beta2: float = 1.0,
        cas_threshold: float = 0.2,
        normalize: bool = True,
        min_queries: int = 2,
        device: Any = None,
        batch_size: int = 64,
        progress: bool = True,
        **localizer_params: Any,
    ) -> None:
        tau = check_value("tau", tau, self._parameter_constraints["tau"])  # a number: as a float
        cls = type(localizer) if isinstance(localizer, Localizer) else get(localizer)
        if not cls.per_query:
            raise ValueError(
                f"localizer {cls.name!r} gives no per-query scores (prompt_scores_); "
                f"choose one of {available(per_query=True)}"
            )
        if isinstance(localizer, Localizer):
            if localizer_params:
                raise ValueError("localizer parameters go to the localizer's constructor, not here")
            self.localizer_ = localizer
        else:
            self.localizer_ = cls(model, device=device, batch_size=batch_size, progress=False, **localizer_params)
        self.model = model
        self.tau, self.score, self.beta1, self.beta2 = tau, score, float(beta1), float(beta2)
        self.cas_threshold, self.normalize, self.min_queries = float(cas_threshold), bool(normalize), int(min_queries)
        self.query_threshold = float(getattr(self.localizer_, "threshold", 0.2))
        self.progress = bool(progress)

    # ------------------------------------------------------------------------------------ fitting
    def fit(self, data: Any) -> QueryLocalization:
        """Localize every query of every fact in ``data`` (a list of facts, each a list of paraphrased
        queries, or a mapping name -> fact), then score consistency (see :meth:`fit_scores`).

        All facts are validated and tokenized before the first attribution runs.
        """
        names, groups = as_facts(data, min_queries=self.min_queries)
        validate.model(self.model)
        for g in groups:
            encode(self.model, g, max_target_tokens=1)  # TokenizationError (a ValueError) before work
        self.localizer_._begin_fit()  # the model moved to the localizer's device before dist.init reads it
        dist.init(self.model.cfg.device)  # under torchrun: each rank localizes every world_size-th fact
        mine = dist.shard(list(range(len(groups))))
        done: list[tuple[int, torch.Tensor]] = []
        show = self.progress and dist.is_main()
        desc = f"query localization ({self.localizer_.name})"
        bar = tqdm(total=sum(len(groups[k]) for k in mine), desc=desc, disable=not show)
        checks = []
        with warnings.catch_warnings():  # one completeness warning for all facts, below
            warnings.simplefilter("ignore", CompletenessWarning)
            for k in mine:
                self.localizer_.fit(groups[k])
                done.append((k, self.localizer_.prompt_scores_.detach().float().cpu()))
                checks.append((k, getattr(self.localizer_, "meta_", {}).get("ig_check", {})))
                bar.update(len(groups[k]))
        bar.close()
        scores = dist.gather_indexed(done)
        self.fit_scores(scores, names=names, facts=groups)
        check = merge_reports(dist.gather_indexed(checks))  # every rank's facts, in the one-process order
        if check:  # IG-based localizers: per layer, over every query of every fact
            self.meta_["ig_check"] = check
            warn_report(check, "QueryLocalization.fit")  # only where a tolerance was asked and missed
        return self

    def estimate(self, data: Any) -> Any:
        """Predicted seconds and peak memory of ``fit(data)``: the localizer's on every fact
        (:meth:`capinterp.localizers.base.Localizer.estimate`)."""
        from capinterp.localizers.cost import estimate

        return estimate(self, data)

    def _cost(self, data: Any) -> Any:
        from capinterp.localizers.cost_work import Work

        _, groups = as_facts(data, min_queries=self.min_queries)
        work = Work(validate.model(self.model))
        for g in groups:
            work.merge(self.localizer_._cost(g))
        return work

    def fit_scores(
        self,
        query_scores: Sequence[torch.Tensor],
        names: Sequence[Hashable] | None = None,
        facts: Sequence[Sequence[Example]] | None = None,
    ) -> QueryLocalization:
        """Score consistency from precomputed per-query maps (one ``[n_i, L, d_mlp]`` tensor per fact)."""
        if not query_scores:
            raise ValueError("no facts given: query_scores is empty")
        shape = neuron_shape(self.model)
        for k, s in enumerate(query_scores):
            if s.ndim != 3 or tuple(s.shape[1:]) != shape:
                raise ValueError(f"fact {k}: scores must be [n_queries, {shape[0]}, {shape[1]}], got {tuple(s.shape)}")
            if s.shape[0] < self.min_queries:
                raise ValueError(f"fact {k} has {s.shape[0]} queries; at least {self.min_queries} are needed")
        self.names_: list[Hashable] = list(names) if names is not None else list(range(len(query_scores)))
        if len(self.names_) != len(query_scores) or (facts is not None and len(facts) != len(query_scores)):
            raise ValueError("names / facts must have one entry per fact")
        if facts is not None and any(len(f) != s.shape[0] for f, s in zip(facts, query_scores)):
            raise ValueError("every fact needs one score map per query")
        self.facts_ = [list(f) for f in facts] if facts is not None else None
        self.query_scores_ = [s.detach().float().cpu() for s in query_scores]
        self.meta_ = {"method": "query_localization", "params": self.get_params(), **model_meta(self.model)}
        self.query_neurons_ = [
            [NeuronSet(coarse_mask(q, self.query_threshold), meta=self.meta_) for q in s] for s in self.query_scores_
        ]
        self.consistency_ = self._frame()
        return self

    def get_params(self) -> dict[str, Any]:
        """Hyper-parameters of the analysis (recorded in result metadata)."""
        loc = self.localizer_.get_params() if hasattr(self.localizer_, "get_params") else {}
        return {
            "localizer": type(self.localizer_).name,
            "tau": self.tau,
            "score": self.score,
            "beta1": self.beta1,
            "beta2": self.beta2,
            "cas_threshold": self.cas_threshold,
            "normalize": self.normalize,
            "query_threshold": self.query_threshold,
            "localizer_params": loc,
        }

    def _frame(self) -> pd.DataFrame:
        rows = []
        for k, sets in enumerate(self.query_neurons_):
            cs1, cs2 = consistency(sets) if len(sets) > 1 else (float("nan"), float("nan"))
            stack = torch.stack([s.mask for s in sets])
            rows.append(
                {
                    "fact": self.names_[k],
                    "answer": self.facts_[k][0].target.strip() if self.facts_ else None,
                    "n_queries": len(sets),
                    "mean_size": float(stack.sum((1, 2)).float().mean()),
                    "n_union": int(stack.any(0).sum()),
                    "n_intersection": int(stack.all(0).sum()),
                    "cs1": cs1,
                    "cs2": cs2,
                }
            )
        df = pd.DataFrame(rows).set_index("fact")
        values = df[self.score].to_numpy(dtype=float)
        finite = values[np.isfinite(values)]
        self.tau_static_ = 0.3 if isinstance(self.tau, str) else float(self.tau)
        self.tau_otsu_ = otsu_threshold(finite) if finite.size else float("nan")
        df["consistent_static"] = df[self.score] >= self.tau_static_
        df["consistent_otsu"] = df[self.score] >= self.tau_otsu_
        chosen = df["consistent_otsu"] if self.tau == "otsu" else df["consistent_static"]
        df["class"] = np.where(chosen, "consistent", "inconsistent")
        return df

    def _check_fitted(self) -> None:
        if not hasattr(self, "consistency_"):
            raise RuntimeError("QueryLocalization is not fitted yet: call .fit(facts) first")

    # ------------------------------------------------------------------------------------ results
    def summary(self) -> pd.Series:
        """Share of inconsistent facts (static tau and Otsu), the taus, mean CS1/CS2, Welch's t.

        The distribution plot is :meth:`plot`. Welch's t compares the score of the two static
        classes (the paper reports this test); it is NaN when a class has fewer than two facts.
        """
        self._check_fitted()
        df = self.consistency_
        a = df.loc[df["consistent_static"], self.score].to_numpy(float)
        b = df.loc[~df["consistent_static"], self.score].to_numpy(float)
        t = float("nan")
        if a.size > 1 and b.size > 1:
            se = np.sqrt(a.var(ddof=1) / a.size + b.var(ddof=1) / b.size)
            t = float((a.mean() - b.mean()) / se) if se > 0 else float("inf")
        return pd.Series(
            {
                "n_facts": len(df),
                "score": self.score,
                "mean_cs1": float(df["cs1"].mean()),
                "mean_cs2": float(df["cs2"].mean()),
                "tau_static": self.tau_static_,
                "tau_otsu": self.tau_otsu_,
                "share_inconsistent_static": float((~df["consistent_static"]).mean()),
                "share_inconsistent_otsu": float((~df["consistent_otsu"]).mean()),
                "mean_query_neurons": float(df["mean_size"].mean()),
                "welch_t": t,
                **self._completeness_summary(),
            }
        )

    def _completeness_summary(self) -> dict[str, Any]:
        """The worst layer's IG completeness error over all queries (when the localizer is IG-based)."""
        worst = worst_layers(self.meta_.get("ig_check", {}), k=1)
        if not worst:
            return {}
        return {"completeness_max": worst[0][1], "completeness_worst_layer": worst[0][0]}

    def plot(self, bins: int = 20, title: str | None = None):
        """Histogram of CS1 and CS2 over facts with the static and Otsu thresholds (plotly Figure)."""
        import plotly.graph_objects as go

        self._check_fitted()
        df = self.consistency_
        fig = go.Figure()
        for col in SCORES:
            fig.add_histogram(
                x=df[col],
                name=col.upper(),
                xbins={"start": 0, "end": 1.0001, "size": 1 / bins},
                opacity=0.6,
                hovertemplate=col.upper() + " %{x}: %{y} facts<extra></extra>",
            )
        for tau, name, dash in ((self.tau_static_, "static", "dash"), (self.tau_otsu_, "Otsu", "dot")):
            if np.isfinite(tau):
                fig.add_vline(x=tau, line_dash=dash, annotation_text=f"{name} tau={tau:.2f}")
        s = self.summary()
        fig.update_layout(
            barmode="overlay",
            xaxis_title="consistency score",
            yaxis_title="facts",
            title=title
            or (
                f"Neighbor-query consistency ({self.score.upper()}): "
                f"{s['share_inconsistent_static']:.0%} inconsistent (static), "
                f"{s['share_inconsistent_otsu']:.0%} (Otsu)"
            ),
        )
        return fig

    def index_of(self, fact: Any) -> int:
        """Position of a fact given by position, by name, or as the same list of queries."""
        self._check_fitted()
        if isinstance(fact, (int, np.integer)) and not isinstance(fact, bool) and 0 <= int(fact) < len(self.names_):
            return int(fact)
        if isinstance(fact, Hashable) and not isinstance(fact, tuple) and fact in self.names_:
            return self.names_.index(fact)
        if self.facts_ is not None and isinstance(fact, Sequence) and not isinstance(fact, str):
            prompts = [q.prompt for q in as_examples(fact)]
            for k, f in enumerate(self.facts_):
                if [q.prompt for q in f] == prompts:
                    return k
        raise ValueError(f"fact {fact!r:.80} is not one of the {len(self.names_)} fitted facts")

    def cas_scores(self, fact: Any) -> NeuronScores:
        """Consistency-aware scores of one fact (``[n_layers, d_mlp]``)."""
        k = self.index_of(fact)
        cas = consistency_aware_scores(self.query_scores_[k], self.beta1, self.beta2, self.normalize)
        return NeuronScores(cas, meta={**self.meta_, "fact": str(self.names_[k]), "score": "cas"})

    def neurons(self, fact: Any, selection: str = "consistency-aware", query: int = 0) -> NeuronSet:
        """Neurons of one fact: ``"consistency-aware"`` (CAS criterion), ``"query"`` (N_query, the coarse
        set of query ``query``), ``"union"`` (N_g, union over queries) or ``"intersection"``
        (Chen et al. 2025, Sec. 4)."""
        if selection not in NEURON_SELECTIONS:
            raise ValueError(f"unknown selection {selection!r}; choose one of {', '.join(NEURON_SELECTIONS)}")
        k = self.index_of(fact)
        sets = self.query_neurons_[k]
        meta = {**self.meta_, "fact": str(self.names_[k]), "selection": {"criterion": selection}}
        if selection == "consistency-aware":
            mask = coarse_mask(self.cas_scores(k).scores, self.cas_threshold)
            meta["selection"].update(beta1=self.beta1, beta2=self.beta2, cas_threshold=self.cas_threshold)
        elif selection == "query":
            if not -len(sets) <= query < len(sets):
                raise ValueError(f"query {query} out of range for a fact with {len(sets)} queries")
            mask = sets[query].mask
            meta["selection"]["query"] = int(query)
        else:
            stack = torch.stack([s.mask for s in sets])
            mask = stack.any(0) if selection == "union" else stack.all(0)
        return NeuronSet(mask, meta=meta)
