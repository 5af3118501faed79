"""ROME causal tracing (Meng et al., 2022): which (token, layer) states restore a corrupted fact.

For each fact (an Example with ``meta["subject"]``):

1. **Clean run.** o = argmax of the next-token distribution after the prompt; p_clean = p(o).
   When the fact has a target and o is not the target's first token (tokenized in context by
   :func:`capinterp.core.tokens.encode`), the fact is skipped and counted in ``skipped_``.
2. **Corrupted run.** ``samples`` copies of the prompt with Gaussian noise added to the token
   embeddings only (the word-embedding output, :func:`capinterp.kernels.tracing.embed_hook`) at
   the subject's token positions; p* = mean over copies of p(o).
   The noise is drawn from a generator seeded with ``seed`` for every fact (as ROME reseeds per
   call), on the CPU in float32, so a fact always gets the same noise on any device.
3. **Restorations.** For every token t and layer l, the corrupted copies are re-run with one clean
   state written back: kind ``"resid"`` restores ``blocks.l.hook_resid_post`` at t (one layer);
   kinds ``"mlp"`` / ``"attn"`` restore ``blocks.j.hook_mlp_out`` / ``hook_attn_out`` at t for every
   j in the window ``[l - window//2, l + ceil(window/2)) ∩ [0, L)`` (ROME's window; ``[l-5, l+5)``
   for the default 10). IE(t, l) = p*_restored(o) - p*. On parallel-block models (GPT-J, GPT-NeoX,
   Falcon, ...) the MLP and attention of a block read the same residual; their outputs are
   restored separately all the same. On a hybrid model only some layers have softmax attention
   (the others a Mamba, linear-attention or convolution mixer, or NemotronH's FFN alone): kind
   ``"attn"`` restores the attention layers inside each window, and a window holding none restores
   nothing (IE 0; with ``window=1``, every layer without attention).

Noise scale (Meng et al. 2022, Sec. 2.1): ``noise_std`` given -> that literal std; otherwise
``noise`` x the std over every scalar of the stacked token embeddings of all subject tokens
of all facts passed to ``fit`` (ROME's rule ``"s3"`` for ``noise=3.0``; the strings ``"s<k>"`` are
accepted too). Subject tokens are taken in context (in the prompt), including facts that are
later skipped. Both are stds as the residual stream receives the embeddings: where the model
multiplies the embedding hook's output afterwards (Falcon-H1's ``embedding_multiplier``), the noise
added at the hook is divided by that factor (:func:`capinterp.kernels.tracing.embed_gain`).

Batching (restoration rows, KV-cache prefix reuse): see :mod:`capinterp.kernels.tracing`; restorations at
tokens before the first subject token are not run (their IE is exactly 0).

Aggregation. Per-fact grids are [T, L] (``per_prompt_``). ``grids_[kind]`` is ROME's average over
facts by token group, shape [6, L], rows :data:`TOKEN_GROUPS`: first subject token, middle subject
tokens (their mean), last subject token, first token after the subject, further tokens (their
mean, excluding the last token), last token. Groups a fact lacks (e.g. middle tokens of a
one-token subject) are NaN for that fact and ignored by the average.

Under ``torchrun`` the facts are sharded by rank (each fact's trace is independent and its noise
seeded per fact), the records gathered in fact order: every rank ends with the one-process result.

Located layers (docs/localizers/causal_trace.md): rank layers by the IE of
kind ``layer_kind`` (``"mlp"``, what ROME edits) at the token group ``token`` (``"last_subject"``
by default) of the averaged grid, or, with ``token="any"``, by the mean over facts of each fact's
max over all its tokens; keep the ``top_k`` best. ``units_`` is a layer :class:`KeySet` whose
``param_share`` counts the MLP parameters of the located layers.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any, ClassVar

import torch
from tqdm.auto import tqdm

from capinterp.arch.model import require_attention_layers
from capinterp.core import distributed as dist
from capinterp.core import validate
from capinterp.core.constraints import Boolean, Custom, Interval, Options, Subset
from capinterp.core.example import Example
from capinterp.core.protocol import Model
from capinterp.core.tokens import _ids, encode, model_bos
from capinterp.kernels.tracing import (
    KINDS,
    TOKEN_GROUPS,
    embed_gain,
    make_noise,
    parse_noise,
    prefix_ok,
    present_layers,
    restoration_probs,
    state_view,
    subject_std,
    subject_token_range,
    token_groups,
    trace_hook,
)
from capinterp.kernels.tracing import Runner as _Runner
from capinterp.kernels.tracing import last_probs as _last_probs
from capinterp.localizers.base import Localizer, register

__all__ = ["KINDS", "TOKEN_GROUPS", "CausalTrace", "subject_token_range"]


_KINDS = Subset(*KINDS)


@register("causal_trace")
class CausalTrace(Localizer):
    """ROME causal tracing over a list of facts; a layer localizer (``layers_`` / ``units_``).

    Args:
        noise: multiplier of the subject-embedding std (ROME ``"s3"`` = 3.0; ``"s<k>"`` strings ok).
        noise_std: literal noise std; overrides ``noise`` (``0.0`` gives an uncorrupted run).
        samples: corrupted copies per fact (ROME: 10).
        window: number of consecutive MLP / attention layers restored around layer l (ROME: 10).
        kinds: which states to trace, a subset of ``("resid", "mlp", "attn")``.
        top_k: number of located layers.
        token: token group that ranks layers, one of :data:`TOKEN_GROUPS` or ``"any"``.
        layer_kind: kind that ranks layers (default ``"mlp"`` when traced, else the first kind).
        seed: seed of the noise generator.
        require_correct: skip facts whose clean answer is not the target's first token
            (bare facts, without a target, are always traced on the model's own answer: a dict
            with ``prompt`` and ``subject`` but no ``target``, or an Example with
            ``meta["target_from"] = "greedy"``; an explicit empty target is refused).
        reuse_prefix: run restorations at token t only on positions t..T-1, over the KV cache of
            the corrupted copies' first t tokens (which a restoration at t cannot change). Same
            result, about half the work; used when the model returns a HF cache (falls back to
            full sequences otherwise, e.g. TL-native models or prompts beyond a sliding window).
        batch_size: rows (restoration x sample) per forward pass.

    Results: ``grids_`` {kind: [6, L] averaged IE by token group}, ``per_prompt_`` (one dict per
    traced fact: index, prompt, subject, tokens, subject_range, answer, answer_id, p_clean,
    p_corrupt, grids {kind: [T, L]}, probs {kind: [T, L] restored p}), ``layer_scores_`` [L],
    ``layers_`` (top-k, best first), ``units_``, ``skipped_`` (count), ``skipped_facts_`` (dicts),
    ``noise_std_``, ``n_traced_``, ``meta_``.
    """

    unit_kind = "layer"
    fills_greedy = True  # a bare fact is traced on the model's own answer

    _parameter_constraints: ClassVar[dict[str, list[Any]]] = {
        "noise": [Custom(parse_noise, "a multiplier >= 0 or a rule 's<k>'", bad=(-1.0, "m", float("inf")))],
        "noise_std": [Interval(float, 0, None), None],
        "samples": [Interval(int, 1, None)],
        "window": [Interval(int, 1, None)],
        "kinds": [_KINDS],
        "top_k": [Interval(int, 1, None)],  # at most n_layers: checked in fit
        "token": [Options(*TOKEN_GROUPS, "any")],
        "layer_kind": [Options(*KINDS), None],  # among the traced kinds: checked below
        "seed": [Interval(int, None, None)],
        "require_correct": [Boolean()],
        "reuse_prefix": [Boolean()],
    }

    def __init__(
        self,
        model: Model,
        *,
        noise: float | str = 3.0,
        noise_std: float | None = None,
        samples: int = 10,
        window: int = 10,
        kinds: Sequence[str] = KINDS,
        top_k: int = 3,
        token: str = "last_subject",
        layer_kind: str | None = None,
        seed: int = 1,
        require_correct: bool = True,
        reuse_prefix: bool = True,
        batch_size: int = 128,
        device: Any = None,
        progress: bool = True,
    ) -> None:
        super().__init__(model, batch_size=batch_size, device=device, progress=progress)
        self.noise = noise
        self._noise_mult = parse_noise(noise)
        self.noise_std = None if noise_std is None else float(noise_std)
        self.samples, self.window, self.top_k, self.seed = int(samples), int(window), int(top_k), int(seed)
        kinds = _KINDS.check("kinds", (kinds,) if isinstance(kinds, str) else tuple(kinds))  # a generator is read here
        self.kinds = kinds
        self.token = token
        if layer_kind is None:
            layer_kind = "mlp" if "mlp" in kinds else kinds[0]
        if layer_kind not in kinds:
            raise ValueError(f"layer_kind {layer_kind!r} is not among the traced kinds {kinds}")
        self.layer_kind = layer_kind
        self.require_correct, self.reuse_prefix = bool(require_correct), bool(reuse_prefix)

    # ------------------------------------------------------------------------------------ fit

    def _begin_fit(self) -> None:
        super()._begin_fit()
        validate.integer("top_k", self.top_k, low=1, high=int(self.model.cfg.n_layers))

    @torch.no_grad()
    def fit(self, data: Iterable[Any]) -> CausalTrace:
        """Trace every fact in ``data`` (Examples, or dicts / pairs, with ``meta["subject"]``)."""
        facts = validate.examples(data, "CausalTrace.fit(data)", min_count=0)
        if not facts:
            raise ValueError("CausalTrace.fit needs at least one fact (got an empty list)")
        self._begin_fit()
        if "attn" in self.kinds:  # hybrids: attention in some layers only, refused where in none
            require_attention_layers(
                self.model, "causal tracing of attention outputs (kinds with 'attn')", "; trace kinds=('resid', 'mlp')"
            )
        self._present = present_layers(self.model, self.kinds)
        prepared = [self._prepare(i, ex) for i, ex in enumerate(facts)]
        # the noise's std as the residual stream receives it (Falcon-H1 multiplies the hook's output afterwards)
        self._embed_gain = embed_gain(self.model)
        self.noise_std_ = (
            self.noise_std
            if self.noise_std is not None
            else self._noise_mult * self._subject_std(prepared) * self._embed_gain
        )

        self.per_prompt_: list[dict[str, Any]] = []
        self.skipped_facts_: list[dict[str, Any]] = []
        dist.init(self.model.cfg.device)  # under torchrun: each rank traces every world_size-th fact
        it = tqdm(
            dist.shard(prepared), desc="causal trace", disable=not (self.progress and dist.is_main()), leave=False
        )
        mine = [self._trace_one(item) for item in it]
        for res in dist.gather_indexed([(r["index"], r) for r in mine]):
            if res.get("skipped"):
                self.skipped_facts_.append(res)
            else:
                self.per_prompt_.append(res)
        self.skipped_ = len(self.skipped_facts_)
        self.n_traced_ = len(self.per_prompt_)
        if not self.per_prompt_:
            shown = "; ".join(
                f"{s['prompt']!r} -> model says {s['answer']!r}, target {s['target']!r}"
                for s in self.skipped_facts_[:3]
            )
            raise ValueError(
                f"no fact could be traced: all {self.skipped_} were skipped because the model's answer is not "
                f"the target ({shown}). Filter with capinterp.data.facts.facts_known_by(model, facts), or pass "
                "require_correct=False"
            )
        self.grids_ = {k: self._average(k) for k in self.kinds}
        self.layer_scores_ = self.layer_scores(self.layer_kind, self.token)
        self.layers_ = self.top_layers(self.top_k, self.layer_kind, self.token)
        self.units_ = self._units(self.layers_)
        self._set_meta(noise_std=self.noise_std_, n_traced=self.n_traced_, n_skipped=self.skipped_)
        return self

    def _cost(self, data: Iterable[Any]) -> Any:
        """The work of ``fit(data)``, counted before any model work (:meth:`Localizer.estimate`);
        every fact counted as traced (``require_correct`` skips those the model gets wrong)."""
        from capinterp.localizers.cost_counts import trace_work
        from capinterp.localizers.cost_work import Work

        facts = validate.examples(data, "CausalTrace.fit(data)", min_count=0)
        if not facts:
            raise ValueError("CausalTrace.fit needs at least one fact (got an empty list)")
        work = Work(validate.model(self.model))
        for i, ex in enumerate(facts):
            item = self._prepare(i, ex)
            T = len(item["ids"])
            s0 = item["subject_range"][0]
            trace_work(work, T, s0, len(self.kinds), self.samples, self.batch_size, self._prefix_ok(T))
        if self.require_correct:
            work.note("facts the model answers wrongly are skipped by fit (counted here as traced)")
        return work

    def _prepare(self, i: int, ex: Example) -> dict[str, Any]:
        subject = ex.meta.get("subject")
        if not isinstance(subject, str) or not subject:
            raise ValueError(
                f"fact {i} ({ex.prompt!r}) has no meta['subject']; causal tracing needs the subject string"
            )
        tok = self.model.tokenizer
        bare = _ids(tok, ex.prompt)
        if ex.target:
            enc = encode(self.model, [ex], max_target_tokens=1)[0]  # TokenizationError names the problem
            prompt_ids, target_id = enc.prompt_ids, enc.target_ids[0]
        else:
            prompt_ids, target_id = model_bos(self.model) + bare, None
        if not bare:
            raise ValueError(f"fact {i} has an empty prompt")
        n_bos = len(prompt_ids) - len(bare)  # BOS follows the tokenizer's convention (tokens.model_bos)
        try:
            s0, s1 = subject_token_range(tok, ex.prompt, subject, prompt_ids[n_bos:], offset=n_bos)
        except ValueError as err:  # TokenizationError (off the token boundaries) stays one
            raise type(err)(f"fact {i}: {err}") from None
        return {"index": i, "example": ex, "ids": prompt_ids, "target_id": target_id, "subject_range": (s0, s1)}

    def _subject_std(self, prepared: list[dict[str, Any]]) -> float:
        """Std over every scalar of the token embeddings of all subject tokens (in context)."""
        return subject_std(self.model, prepared)

    def _noise(self, n_subject: int) -> torch.Tensor:
        std = self.noise_std_ / self._embed_gain  # in the hook's units: the residual stream gets noise_std_
        return make_noise(self.seed, self.samples, n_subject, int(self.model.cfg.d_model), std)

    def _trace_one(self, item: dict[str, Any]) -> dict[str, Any]:
        model, dev = self.model, self.model.cfg.device
        ids = torch.tensor([item["ids"]], device=dev)
        T, L = ids.shape[1], int(model.cfg.n_layers)
        s0, s1 = item["subject_range"]
        clean: dict[tuple[str, int], torch.Tensor] = {}

        def keeper(key):
            def keep(act, hook):
                clean[key] = state_view(model, key[0], act)[0].detach().clone()

            return keep

        hooks = [(trace_hook(self.model, k, l), keeper((k, l))) for k in self.kinds for l in self._present[k]]
        probs = _last_probs(model, ids, hooks)[0]
        o = int(probs.argmax())
        tok = model.tokenizer
        base = {
            "index": item["index"],
            "prompt": item["example"].prompt,
            "target": item["example"].target,
            "subject": item["example"].meta["subject"],
            "answer": tok.decode([o]),
            "answer_id": o,
        }
        if self.require_correct and item["target_id"] is not None and o != item["target_id"]:
            return {
                **base,
                "skipped": True,
                "reason": "clean answer is not the target's first token",
                "p_clean": float(probs[o]),
                "p_target": float(probs[item["target_id"]]),
            }

        noise = self._noise(s1 - s0).to(dev, dtype=next(iter(clean.values())).dtype)
        run = _Runner(self, ids, noise, (s0, s1), clean, o)
        p_star_rows, cache = run.corrupted(use_cache=self._prefix_ok(T))
        p_star = float(p_star_rows.mean())
        p_res = restoration_probs(run, self.kinds, self.window, s0, L, self.batch_size, cache, self._present)
        grids, restored = {}, {}
        for ki, k in enumerate(self.kinds):
            pr = torch.full((T, L), p_star)
            pr[s0:] = p_res[:, ki]
            grids[k], restored[k] = pr - p_star, pr
        return {
            **base,
            "tokens": [tok.decode([t]) for t in item["ids"]],
            "subject_range": (s0, s1),
            "p_clean": float(probs[o]),
            "p_corrupt": p_star,
            "p_corrupt_samples": p_star_rows,
            "grids": grids,
            "probs": restored,
        }

    def _prefix_ok(self, T: int) -> bool:
        """Whether suffix runs over a cached corrupted prefix can be used for a T-token prompt."""
        return prefix_ok(self.model, self.reuse_prefix, T)

    # ------------------------------------------------------------------------------ aggregation

    @staticmethod
    def token_groups(T: int, subject_range: tuple[int, int]) -> dict[str, list[int]]:
        """ROME's token groups for a prompt of T tokens (positions; empty when absent)."""
        return token_groups(T, subject_range)

    def _average(self, kind: str) -> torch.Tensor:
        L = int(self.model.cfg.n_layers)
        stack = torch.full((len(self.per_prompt_), len(TOKEN_GROUPS), L), float("nan"))
        for p, rec in enumerate(self.per_prompt_):
            g = rec["grids"][kind]
            for gi, pos in enumerate(self.token_groups(g.shape[0], rec["subject_range"]).values()):
                if pos:
                    stack[p, gi] = g[pos].mean(0)
        return stack.nanmean(0)

    def layer_scores(self, kind: str | None = None, token: str | None = None) -> torch.Tensor:
        """Per-layer score [L]: averaged IE at a token group, or (``"any"``) mean of per-fact max over tokens."""
        self._check_fitted("per_prompt_")
        kind = kind or self.layer_kind
        token = token or self.token
        if kind not in self.kinds:
            raise ValueError(f"kind {kind!r} was not traced (kinds={self.kinds})")
        if token == "any":
            return torch.stack([rec["grids"][kind].max(0).values for rec in self.per_prompt_]).mean(0)
        if token not in TOKEN_GROUPS:
            raise ValueError(f"token must be one of {TOKEN_GROUPS + ('any',)}, got {token!r}")
        row = (
            self.grids_[kind][TOKEN_GROUPS.index(token)]
            if hasattr(self, "grids_")
            else self._average(kind)[TOKEN_GROUPS.index(token)]
        )
        if torch.isnan(row).all():
            raise ValueError(f"no traced fact has a {token!r} token (e.g. all subjects are one token)")
        return row

    def top_layers(self, k: int | None = None, kind: str | None = None, token: str | None = None) -> list[int]:
        """The ``k`` layers with the largest :meth:`layer_scores`, best first (ties: lower layer first)."""
        scores = self.layer_scores(kind, token)
        k = self.top_k if k is None else int(k)
        if not 1 <= k <= scores.numel():
            raise ValueError(f"k must be in [1, {scores.numel()}], got {k}")
        order = sorted(range(scores.numel()), key=lambda l: (-_nan_low(float(scores[l])), l))
        return order[:k]

    def _units(self, layers: list[int]):
        from capinterp.arch.model import neuron_param_info
        from capinterp.units.base import KeySet

        mlp = self.model.blocks[0].mlp
        seen, per_layer = set(), 0
        for p in mlp.parameters():
            if id(p) not in seen:
                seen.add(id(p))
                per_layer += p.numel()
        return KeySet.layers(
            layers,
            int(self.model.cfg.n_layers),
            unit_params=int(per_layer),
            n_params=neuron_param_info(self.model)["n_params"],
        )

    # ------------------------------------------------------------------------------------ plot

    def plot(self, kind: str = "mlp", prompt: int | None = None, title: str | None = None):
        """Plotly heatmap like ROME's figure (rows = tokens, subject tokens marked ``*``; x = layers).

        ``prompt=None`` plots the single traced fact when there is one, else the average by token
        group; ``prompt=i`` plots the i-th traced fact (index into ``per_prompt_``).
        """
        self._check_fitted("per_prompt_")
        if kind not in self.kinds:
            raise ValueError(f"kind {kind!r} was not traced (kinds={self.kinds})")
        from capinterp.plots.tracing import trace_heatmap

        if prompt is None and len(self.per_prompt_) == 1:
            prompt = 0
        if prompt is None:
            labels = ["first subject*", "middle subject*", "last subject*", "first after", "further", "last"]
            return trace_heatmap(
                self.grids_[kind],
                labels,
                kind=kind,
                window=self.window,
                subject_rows=[0, 1, 2],
                title=title or f"Average indirect effect of restoring {kind} ({self.n_traced_} facts)",
            )
        rec = self.per_prompt_[prompt]
        s0, s1 = rec["subject_range"]
        labels = [f"{t!r}"[1:-1] + ("*" if s0 <= i < s1 else "") for i, t in enumerate(rec["tokens"])]
        return trace_heatmap(
            rec["grids"][kind],
            labels,
            kind=kind,
            window=self.window,
            subject_rows=list(range(s0, s1)),
            answer=rec["answer"],
            title=title or f"Indirect effect of restoring {kind}: {rec['prompt']!r} -> {rec['answer']!r}",
        )


def _nan_low(x: float) -> float:
    return -math.inf if math.isnan(x) else x
