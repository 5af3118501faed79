"""Knowledge circuits (Yao et al., NeurIPS 2024): the edges of the computational graph behind facts.

>>> kc = KnowledgeCircuit(model, algorithm="eap-ig", top_n=200, steps=30).fit(facts)
>>> kc.circuit_            # Circuit: kept edges + all edge scores; .save(), .plot(), .edge_heatmap()
>>> kc.units_              # EdgeSet (a KeySet of kind "edge"): keys ("a3.h1", "a5.h2<q"), param_share
>>> capinterp.circuits.hit_at_k(model, kc.circuit_, facts)   # circuit-only Hit@1 / Hit@10

Algorithms:

* ``"eap-ig"`` (default): edge attribution patching with integrated gradients, ``steps`` points
  (30; the KC notebook uses 100 on one pair), then the top ``top_n`` edges by |score| (or those with
  |score| >= ``min_score``), then dead-node pruning;
* ``"eap"``: the same with one gradient at the clean run;
* ``"acdc"``: greedy zero-ablation pruning with MatchNLL and threshold ``acdc_threshold`` (0.01).
  One forward pass per edge: fine on small models; on SmolLM2 pass ``candidates=N`` to visit only
  the top N edges of an EAP-IG pass (the rest start removed).

Circuit-only evaluation ablates every edge outside the circuit: ``hit_at_k(..., ablation="zero")``
is KC / CNL's convention; EAP-IG circuits are found with corrupted-run patching, and
``ablation="corrupt"`` (the EAP-IG library's convention) is the matching test: on SmolLM2 the top
1,000 of 70,651 edges keep the full model's Hit@1 under it, while zero ablation drops Hit@1 to 0
even with 20,000 edges (zeroing the generic, position-wide contributions EAP never scores).

Graph, corruption and loss conventions: :mod:`capinterp.circuits` (graph.py, eap.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, ClassVar

from capinterp.arch.family import family_of, require_fixed_heads
from capinterp.circuits.acdc import acdc
from capinterp.circuits.eap import LOSSES, make_pairs, score_edges
from capinterp.circuits.forward import check_additive, node_params
from capinterp.circuits.graph import GRANULARITIES, Circuit, Graph, prune_dead, select_edges
from capinterp.core import validate
from capinterp.core.constraints import Boolean, Interval, IsCallable, Options
from capinterp.core.protocol import Model
from capinterp.core.tokens import encode
from capinterp.kernels.quadrature import RULES, check_rule
from capinterp.localizers.base import Localizer, register

__all__ = ["KnowledgeCircuit"]

ALGORITHMS = {"eap": "eap", "eap-ig": "eap-ig", "eap_ig": "eap-ig", "acdc": "acdc"}


@register("knowledge_circuit")
class KnowledgeCircuit(Localizer):
    """Locate a knowledge circuit by edge attribution (EAP / EAP-IG) or greedy ablation (ACDC).

    Yao et al. (2024), Sec. 2 (circuit discovery); the EAP-IG scores of Hanna et al. (2024).
    ``fit(data)`` takes facts (Examples with ``meta["subject"]``) and leaves ``circuit_`` (kept
    edges and all ``[n_edges]`` edge scores), ``scores_``, ``units_`` (an edge KeySet), ``meta_``.

    Args:
        algorithm: ``"eap-ig"``, ``"eap"`` or ``"acdc"``.
        top_n: edges kept by EAP / EAP-IG (largest |score|), before dead-node pruning.
        min_score: EAP: keep edges with |score| >= min_score (with ``top_n``: both rules).
        acdc_threshold: ACDC: an edge stays removed when its MatchNLL increase is below this (0.01).
        steps: integration points of EAP-IG.
        rule: their quadrature, ``"right"`` (Riemann, Hanna et al. 2024) or ``"gauss"`` etc.
            (:mod:`capinterp.kernels.quadrature`).
        corrupt: ``"auto"`` (subject swap, noise fallback), ``"noise"``, or a callable (see eap.py).
        metric: EAP loss, ``"auto"`` / ``"logit_diff"`` / ``"nll"`` (:data:`capinterp.circuits.eap.LOSSES`).
        noise: noise std in units of the subject embeddings' std (noise corruption).
        granularity: ``"auto"`` (q/k/v slots when the model allows), ``"qkv"`` or ``"head"``.
        prune: drop edges on no input -> logits path.
        candidates: ACDC only: visit only the top N edges of an EAP-IG pass with ``steps`` steps.
        seed: corruption choice and noise.
    """

    unit_kind = "edge"

    _parameter_constraints: ClassVar[dict[str, list[Any]]] = {
        "algorithm": [Options(*ALGORITHMS)],
        "top_n": [Interval(int, 0, None), None],
        "min_score": [Interval(float, None, None), None],
        "steps": [Interval(int, 1, None)],
        "corrupt": [Options("auto", "noise"), IsCallable()],
        "metric": [Options(*LOSSES)],
        "noise": [Interval(float, 0, None)],
        "granularity": [Options(*GRANULARITIES, "auto")],
        "prune": [Boolean()],
        "candidates": [Interval(int, 1, None), None],
        "seed": [Interval(int, None, None)],
        "acdc_threshold": [Interval(float, 0, None)],
        "rule": [Options(*RULES)],
    }

    def __init__(
        self,
        model: Model,
        *,
        algorithm: str = "eap-ig",
        top_n: int | None = 200,
        min_score: float | None = None,
        steps: int = 30,
        corrupt: str | Callable = "auto",
        metric: str = "auto",
        noise: float = 3.0,
        granularity: str = "auto",
        prune: bool = True,
        candidates: int | None = None,
        seed: int = 0,
        batch_size: int = 8,
        device: Any = None,
        progress: bool = True,
        acdc_threshold: float = 0.01,
        rule: str = "right",
    ) -> None:
        super().__init__(model, batch_size=batch_size, device=device, progress=progress)
        if ALGORITHMS[algorithm] != "acdc" and top_n is None and min_score is None:
            raise ValueError("EAP needs top_n or min_score to select edges")
        check_rule(steps, rule)  # a rule's own minimum of steps
        self.algorithm = ALGORITHMS[algorithm]
        self.top_n = None if top_n is None else int(top_n)
        self.min_score = None if min_score is None else float(min_score)
        self.acdc_threshold = float(acdc_threshold)
        self.steps = int(steps)
        self.rule = rule
        self.corrupt = corrupt
        self.metric = metric
        self.noise = float(noise)
        self.granularity = granularity
        self.prune = bool(prune)
        self.candidates = candidates
        self.seed = int(seed)

    def _eap(self, graph: Graph, facts: list, steps: int) -> tuple[Any, dict]:
        pairs = make_pairs(self.model, facts, self.corrupt, seed=self.seed)
        rule = "right" if steps == 1 else self.rule  # one point: plain EAP (gradient at the clean input)
        return score_edges(
            self.model,
            graph,
            pairs,
            steps=steps,
            rule=rule,
            metric=self.metric,
            noise=self.noise,
            seed=self.seed,
            batch_size=self.batch_size,
            progress=self.progress,
        )

    def _cost(self, data: Any) -> Any:
        """The work of ``fit(data)``, counted before the passes (:meth:`Localizer.estimate`)."""
        from capinterp.localizers.cost_counts import eap_work
        from capinterp.localizers.cost_work import Work

        facts = validate.examples(data, "KnowledgeCircuit.fit(data)", min_count=0)
        if not facts:
            raise ValueError("KnowledgeCircuit.fit needs at least one fact")
        work = Work(validate.model(self.model))
        lengths = [len(it.ids) for it in encode(self.model, facts)]
        if self.algorithm != "acdc":
            eap_work(work, lengths, 1 if self.algorithm == "eap" else self.steps, self.batch_size)
            return work
        if self.candidates is not None:
            eap_work(work, lengths, self.steps, self.batch_size)
        edges = self.candidates or Graph.from_model(self.model, self.granularity).n_edges
        T = max(lengths)
        work.add("acdc trials", rows=len(lengths), tokens=T, logits=T, calls=int(edges))
        return work

    def fit(self, data: Any) -> KnowledgeCircuit:
        """Score every edge of the model's graph on the facts in ``data``, keep the circuit."""
        facts = validate.examples(data, "KnowledgeCircuit.fit(data)", min_count=0)
        if not facts:
            raise ValueError("KnowledgeCircuit.fit needs at least one fact")
        self._begin_fit()
        require_fixed_heads(family_of(self.model), "a knowledge circuit (attention heads as graph nodes)")
        encode(self.model, facts)  # tokenization problems (TokenizationError) surface before any forward pass
        t0 = time.perf_counter()
        graph = Graph.from_model(self.model, self.granularity)
        check_additive(self.model, graph)
        if self.algorithm == "acdc":
            cand = None
            if self.candidates is not None:
                eap_scores, _ = self._eap(graph, facts, self.steps)
                cand = select_edges(graph, eap_scores, top_n=self.candidates)
            mask, scores, info = acdc(
                self.model,
                graph,
                facts,
                threshold=self.acdc_threshold,
                candidates=cand,
                batch_size=self.batch_size,
                progress=self.progress,
            )
        else:
            scores, info = self._eap(graph, facts, 1 if self.algorithm == "eap" else self.steps)
            mask = select_edges(graph, scores, top_n=self.top_n, min_score=self.min_score)
        n_selected = int(mask.sum())
        if self.prune:
            mask = prune_dead(graph, mask)
        meta = self._set_meta(
            algorithm=self.algorithm,
            n_facts=len(facts),
            n_selected=n_selected,
            info=info,
            seconds=time.perf_counter() - t0,
            n_edges=graph.n_edges,
        )
        self.graph_ = graph
        self.scores_ = scores
        self.info_ = info
        self.circuit_ = Circuit(graph, mask, scores, meta, node_params(self.model, graph))
        self.units_ = self.circuit_.units(n_params=meta["n_params"]).with_meta(meta)  # saves with its identity
        return self
