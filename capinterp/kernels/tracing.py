"""Batched restoration engine of ROME causal tracing (used by :mod:`capinterp.localizers.causal_trace`).

Everything here works on one model and one fact at a time; the localizer class, its validation,
aggregation and located layers live in :class:`capinterp.localizers.causal_trace.CausalTrace`.

Batching. A restoration needs ``samples`` corrupted rows; all restorations of a fact are laid out as
``restoration x sample`` rows and run in chunks of ``batch_size`` rows, each row patched by
per-row hooks (row r restores its own (kind, t, l)); only the last position is unembedded.
States at positions before t are those of the corrupted run whatever is restored at t, so with
``reuse_prefix=True`` the restorations at token t run only positions t..T-1 on top of a copy of
the corrupted copies' KV cache cropped to t tokens (rows of one chunk share one t). Restorations
at tokens before the first subject token are not run: the noise cannot reach those states
(causal attention), so restoring them changes nothing and their IE is exactly 0.

The stair (the default with ``reuse_prefix=True``, :func:`stair_restoration_probs`,
:mod:`capinterp.kernels._trace_stair`) goes further: every state below a restored window's first layer
is the corrupted run's, so each row starts at that layer from the corrupted copies' recorded residual,
over positions t..T-1 and their prefix keys/values; only the last position is unembedded. Where the
direct block calls cannot replay a model's layout (checked against the bridge's own corrupted logits
for every token t), the batched rows above run instead; a linear-attention or recurrent state (a
hybrid's mixers) always takes them.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from typing import Any

import torch
from einops import rearrange, reduce, repeat
from jaxtyping import Float, Int
from torch import Tensor

from capinterp.arch.family import family_of
from capinterp.arch.forward import batch_first, capture
from capinterp.arch.model import attention_layers
from capinterp.core.protocol import Model
from capinterp.core.tokens import subject_span
from capinterp.kernels._trace_stair import Unsupported, _keep_last, check, noise_hook, record, stair_probs
from capinterp.kernels.prefix_state import unshared_state

__all__ = [
    "HOOK",
    "KINDS",
    "TOKEN_GROUPS",
    "Runner",
    "embed_hook",
    "last_probs",
    "make_noise",
    "parse_noise",
    "prefix_ok",
    "present_layers",
    "restoration_probs",
    "row_hooks",
    "subject_std",
    "subject_token_range",
    "token_groups",
    "trace_hook",
]

KINDS = ("resid", "mlp", "attn")
TOKEN_GROUPS = ("first_subject", "middle_subject", "last_subject", "first_after", "further", "last")
HOOK = {"resid": "hook_resid_post", "mlp": "hook_mlp_out", "attn": "hook_attn_out"}
# the same states where the bridge gives a block no residual aliases (DeepSeek-V4: its block output is
# its hyper-connections' streams, [batch, pos, streams, d_model], restored whole)
_PLAIN = {"resid": "hook_out", "mlp": "mlp.hook_out", "attn": "attn.hook_out"}


def trace_hook(model: Model, kind: str, layer: int) -> str:
    """The hook whose state kind ``kind`` restores at block ``layer``: TransformerLens' alias
    (``hook_resid_post``, ``hook_mlp_out``, ``hook_attn_out``), or the module output it names. On
    Gemma 3n the residual is the block's output, every AltUp stream (``hook_resid_post`` is one of them)."""
    if kind == "resid" and model is not None and family_of(model).altup_streams > 1:
        return f"blocks.{layer}.{_PLAIN[kind]}"
    name = f"blocks.{layer}.{HOOK[kind]}"
    hooks = getattr(model, "hook_dict", None)
    return name if hooks is None or name in hooks else f"blocks.{layer}.{_PLAIN[kind]}"


# ------------------------------------------------------------------------------ subject & noise


def subject_token_range(
    tokenizer, prompt: str, subject: str, prompt_ids: Sequence[int], offset: int = 0
) -> tuple[int, int]:
    """Token positions ``[start, end)`` of the first occurrence of ``subject`` in ``prompt``.

    ``prompt_ids`` are the prompt's tokens (without special tokens); ``offset`` is added to the
    positions (1 when a BOS token is prepended). The rule is :func:`capinterp.core.tokens.subject_span`'s
    (shared with ROME): ValueError when the subject is not in the prompt,
    :class:`~capinterp.core.tokens.TokenizationError` when it does not start and end on token boundaries.
    """
    return subject_span(tokenizer, prompt, subject, prompt_ids, offset=offset)


def parse_noise(noise: float | str) -> float:
    """The noise multiplier of ``noise`` (a float, or ROME's rule string ``"s<k>"``)."""
    if isinstance(noise, str):
        if noise[:1] == "s":
            try:
                return float(noise[1:])
            except ValueError:
                pass
        raise ValueError(f"noise must be a multiplier (float) or a rule 's<k>' such as 's3', got {noise!r}")
    if not isinstance(noise, (int, float)) or noise < 0 or not math.isfinite(noise):
        raise ValueError(f"noise must be a finite multiplier >= 0, got {noise!r}")
    return float(noise)


def embed_hook(model: Model) -> str:
    """Hook of the token embeddings the noise goes into: the word-embedding module's output.

    ``embed.hook_out`` where the bridge has it: before an embedding LayerNorm (BLOOM's
    ``word_embeddings_layernorm``, which the bridge's ``hook_embed`` alias points past; ROME corrupts
    the word-embedding output), and after an embedding multiplier the bridge folds into it
    (Granite: the embedding as the residual stream receives it). ``hook_embed`` otherwise.
    """
    hooks = getattr(model, "hook_dict", None) or {}
    return "embed.hook_out" if "embed.hook_out" in hooks else "hook_embed"


@torch.no_grad()
def embed_gain(model: Model) -> float:
    """The factor the model applies to :func:`embed_hook`'s output before the residual stream receives
    it: Falcon-H1's ``embedding_multiplier``, which transformers applies after the embedding module,
    past the bridge's hook; 1 where the family has none or the bridge folds it into the hook (Granite).
    Read from the hook on two tokens, against the transformers embedding module's own output."""
    mult = family_of(model).embedding_multiplier
    if mult == 1.0:
        return 1.0
    ids = torch.tensor([[0, 1]], device=model.cfg.device)
    seen = capture(model, ids, embed_hook(model)).float()
    raw = model.embed.original_component(ids).float()
    if torch.allclose(seen, raw * mult, rtol=1e-3, atol=1e-6):
        return 1.0
    if torch.allclose(seen, raw, rtol=1e-3, atol=1e-6):
        return mult
    raise RuntimeError(
        f"{family_of(model).name}: the embedding hook {embed_hook(model)!r} is neither the embedding module's "
        f"output nor that output times embedding_multiplier ({mult}); the noise scale would be in unknown units"
    )


def subject_std(model: Model, prepared: list[dict[str, Any]]) -> float:
    """Std over every scalar of the token embeddings (:func:`embed_hook`) of all subject tokens (in context)."""
    chunks: list[torch.Tensor] = []
    dev = model.cfg.device
    for item in prepared:
        s0, s1 = item["subject_range"]
        act = capture(model, torch.tensor([item["ids"]], device=dev), embed_hook(model))
        chunks.append(rearrange(act[0, s0:s1].detach().float(), "s d -> (s d)").cpu())
    flat = torch.cat(chunks)
    return float(flat.std()) if flat.numel() > 1 else 0.0


def make_noise(
    seed: int, samples: int, n_subject: int, d_model: int, std: float
) -> Float[Tensor, "samples n_subject d_model"]:
    """[samples, n_subject, d_model] Gaussian noise of std ``std``, drawn on the CPU in float32 from ``seed``."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    eps = torch.randn(samples, n_subject, d_model, generator=gen, dtype=torch.float32)
    return eps * std


# ------------------------------------------------------------------------------ restoration rows


def prefix_ok(model: Model, reuse_prefix: bool, T: int) -> bool:
    """Whether suffix runs over a cached corrupted prefix can be used for a T-token prompt."""
    if reuse_prefix is False or unshared_state(model):  # a linear-attention state is not a K/V cache
        return False
    cfg = getattr(getattr(model, "original_model", None), "config", None)
    text = getattr(cfg, "get_text_config", lambda: cfg)() if cfg else None
    # a cropped sliding-window (or Llama 4's chunked-attention) cache would be wrong
    windows = [getattr(text, k, None) for k in ("sliding_window", "attention_chunk_size")]
    return not any(w and int(w) < T for w in windows)


def row_hooks(
    kinds: Sequence[str],
    window: int,
    kind_r: Int[Tensor, " rows"],
    t_r: Int[Tensor, " rows"],
    l_r: Int[Tensor, " rows"],
    L: int,
    present: dict[str, list[int]] | None = None,
    model: Model | None = None,
):
    """[(hook name, kind, layer, local row indices, token indices)] for one chunk of rows. ``present``:
    the layers that have each kind's state (a hybrid model's attention layers); all ``L`` by default.
    ``model``: the hook names are its own (:func:`trace_hook`); TransformerLens' aliases without it."""
    out = []
    half, upper = window // 2, -(-window // 2)
    for ki, k in enumerate(kinds):
        sel = kind_r == ki
        if not bool(sel.any()):
            continue
        for j in range(L) if present is None else present[k]:
            if k == "resid":
                m = sel & (l_r == j)
            else:  # layer j is restored by centres l with l - half <= j < l + upper
                m = sel & (l_r - half <= j) & (j < l_r + upper)
            rows = m.nonzero().flatten()
            if rows.numel():
                name = trace_hook(model, k, j) if model is not None else f"blocks.{j}.{HOOK[k]}"
                out.append((name, k, j, rows, t_r[rows]))
    return out


def restoration_probs(
    run: Runner,
    kinds: Sequence[str],
    window: int,
    s0: int,
    L: int,
    batch_size: int,
    cache,
    present: dict[str, list[int]] | None = None,
) -> Float[Tensor, "n_t kinds n_layers"]:
    """Restored p(o) [T - s0, K, L] (mean over samples) for every (token >= s0, kind, layer).

    Restorations are token-major, (t, kind, layer) for t >= s0, one row per restoration x sample;
    with a ``cache`` each token t gets its own suffix run(s) over the corrupted prefix. ``present``:
    the layers that have each kind's state (:func:`present_layers`); a window restores those it holds.
    """
    if run.stair:
        try:
            return stair_restoration_probs(run, kinds, window, s0, L, batch_size, present)
        except (Unsupported, TypeError, ValueError, NotImplementedError, AttributeError, RuntimeError):
            run.stair = False  # a layout the direct block calls cannot replay: the bridge route below
    T, K, S = run.T, len(kinds), run.samples
    n_t = T - s0
    t_idx = repeat(torch.arange(s0, T), "t -> (t k l)", k=K, l=L)
    k_idx = repeat(torch.arange(K), "k -> (t k l)", t=n_t, l=L)
    l_idx = repeat(torch.arange(L), "l -> (t k l)", t=n_t, k=K)
    n_rows = n_t * K * L * S
    p_rows = torch.empty(n_rows)
    if cache is not None:  # one suffix run per token t over the corrupted prefix's KV cache
        spans = [(i * K * L * S, (i + 1) * K * L * S, s0 + i) for i in range(n_t)]
    else:
        spans = [(0, n_rows, 0)]
    for lo, hi, t0 in spans:
        for a in range(lo, hi, batch_size):
            rows = torch.arange(a, min(a + batch_size, hi))
            r = rows // S
            spec = row_hooks(kinds, window, k_idx[r], t_idx[r] - t0, l_idx[r], L, present, run.model)
            p_rows[a : a + rows.numel()] = run.rows(rows % S, spec, t0, cache if t0 > 0 else None)
    return reduce(p_rows, "(t k l s) -> t k l", "mean", t=n_t, k=K, l=L)


def _window_layers(kind: str, l: int, window: int, present: list[int]) -> list[int]:
    """The layers a restoration of ``kind`` centred at ``l`` writes back (those of ``present`` in the window)."""
    if kind == "resid":
        return [l]
    half, upper = window // 2, -(-window // 2)
    return [j for j in present if l - half <= j < l + upper]


def stair_restoration_probs(
    run: Runner,
    kinds: Sequence[str],
    window: int,
    s0: int,
    L: int,
    batch_size: int,
    present: dict[str, list[int]] | None = None,
) -> Float[Tensor, "n_t kinds n_layers"]:
    """:func:`restoration_probs` by the stair (:mod:`capinterp.kernels._trace_stair`): per token t, each
    restoration row joins at its window's first layer over the corrupted copies' recorded run."""
    present = present or {k: list(range(L)) for k in kinds}
    T, K, S, model = run.T, len(kinds), run.samples, run.model
    out = torch.empty(T - s0, K, L)
    dtype = next(iter(run.clean.values())).dtype
    for t in range(s0, T):
        rec = record(model, run.ids, t, run.noise_of, S)
        check(model, rec, dtype)
        p = repeat(rec.logits.float().softmax(-1)[:, run.o].cpu(), "s -> k l s", k=K, l=L).clone()
        plan = []  # (start block, kind index, centre, layers restored)
        for ki, k in enumerate(kinds):
            for l in range(L):
                js = _window_layers(k, l, window, present[k])
                if js:  # a window with no layer of this kind restores nothing: the corrupted p
                    plan.append((js[0], ki, l, js))
        rows = [(st, ki, l, js, s) for st, ki, l, js in sorted(plan, key=lambda r: r[:3]) for s in range(S)]
        for a in range(0, len(rows), batch_size):
            part = rows[a : a + batch_size]
            logits = stair_probs(
                model, rec, [r[0] for r in part], torch.tensor([r[4] for r in part]), _stair_hooks(run, kinds, part, t)
            )
            probs = logits.float().softmax(-1)[:, run.o].cpu()
            for (_, ki, l, _, s), pr in zip(part, probs):
                p[ki, l, s] = pr
        out[t - s0] = p.mean(-1)
    return out


def _stair_hooks(run: Runner, kinds: Sequence[str], part: list, t: int) -> list:
    """Hooks writing the clean states at token t (suffix position 0) into the rows of one stair chunk."""
    dev = run.ids.device
    by_hook: dict[tuple[int, int], list[int]] = {}
    for i, (_, ki, _, js, _) in enumerate(part):
        for j in js:
            by_hook.setdefault((ki, j), []).append(i)
    hooks = []
    for (ki, j), idx in sorted(by_hook.items()):
        k = kinds[ki]
        rows_d, val = torch.tensor(idx, device=dev), run.clean[(k, j)][t]

        def restore(act, hook, rows_d=rows_d, val=val, k=k):
            state_view(run.model, k, act)[rows_d, 0] = val.to(act.dtype)
            return act

        hooks.append((trace_hook(run.model, k, j), restore))
    return hooks


def present_layers(model: Model, kinds: Sequence[str]) -> dict[str, list[int]]:
    """Per kind, the layers that have its state: every layer, but on a hybrid model only the attention
    layers have an attention output (:func:`capinterp.arch.model.attention_layers`): attention tracing
    restores the attention layers in each window."""
    every = list(range(len(model.blocks)))
    return {k: attention_layers(model) if k == "attn" else every for k in kinds}


def token_groups(T: int, subject_range: tuple[int, int]) -> dict[str, list[int]]:
    """ROME's token groups for a prompt of T tokens (positions; empty when absent)."""
    s0, s1 = subject_range
    return {
        "first_subject": [s0],
        "middle_subject": list(range(s0 + 1, s1 - 1)),
        "last_subject": [s1 - 1],
        "first_after": [s1] if s1 < T else [],
        "further": list(range(s1 + 1, T - 1)),
        "last": [T - 1],
    }


# ------------------------------------------------------------------------------ forward passes


def last_probs(model: Model, tokens: Int[Tensor, "batch T"], hooks) -> Float[Tensor, "batch d_vocab"]:
    """Softmax of the logits at the last position only (the unembedding sees one position a row)."""
    logits = model.run_with_hooks(tokens, fwd_hooks=[*hooks, ("unembed.hook_in", _keep_last)])
    return logits[:, -1].float().softmax(-1)


class Runner:
    """Forward passes of corrupted rows for one fact (full sequences or suffixes over a KV cache).

    ``tracer`` is anything with ``model`` and ``samples`` (a :class:`CausalTrace`).
    """

    def __init__(self, tracer: Any, ids, noise, span, clean, o) -> None:
        self.model, self.ids, self.noise, self.span, self.clean, self.o = tracer.model, ids, noise, span, clean, o
        self.samples = tracer.samples
        self.T = ids.shape[1]
        # the stair (capinterp.kernels._trace_stair) unless prefix reuse is off; ``_stair = False`` on the
        # tracer keeps the bridge route (benchmarks/bench_trace.py compares the two)
        self.stair = bool(getattr(tracer, "reuse_prefix", True) and getattr(tracer, "_stair", True))
        self.stair = self.stair and unshared_state(self.model) is None

    def noise_of(self, p0: int, p1: int):
        """The noise hook of all S copies for a run over positions ``[p0, p1)``."""
        return noise_hook(embed_hook(self.model), self.noise, self.span, p0, p1)

    def _noise_hook(self, sample_r: torch.Tensor, t0: int):
        s0, s1 = self.span
        lo = max(s0, t0)
        eps = self.noise[sample_r.to(self.ids.device)][:, lo - s0 :]

        def corrupt(act, hook):
            act = act.clone()
            if s1 > lo:
                act[:, lo - t0 : s1 - t0] += eps.to(act.dtype)
            return act

        return (embed_hook(self.model), corrupt)

    def corrupted(self, use_cache: bool):
        """p(o) of the S corrupted copies, and their KV cache (None when unavailable or unwanted)."""
        S = self.samples
        hooks = [self._noise_hook(torch.arange(S), 0), ("unembed.hook_in", _keep_last)]
        tokens = repeat(self.ids, "1 t -> s t", s=S)
        if use_cache:
            try:
                logits, cache = self.model.run_with_hooks(tokens, fwd_hooks=hooks, return_type="logits_and_cache")
            except (TypeError, ValueError, NotImplementedError):
                logits, cache = None, None
            if logits is not None and all(hasattr(cache, a) for a in ("crop", "batch_select_indices")):
                return logits[:, -1].float().softmax(-1)[:, self.o].cpu(), cache
        logits = self.model.run_with_hooks(tokens, fwd_hooks=hooks)
        return logits[:, -1].float().softmax(-1)[:, self.o].cpu(), None

    def rows(self, sample_r: Int[Tensor, " rows"], spec, t0: int, cache) -> Float[Tensor, " rows"]:
        """p(o) at the last position for corrupted copies ``sample_r`` with restorations ``spec``.

        With a ``cache``, only positions ``t0..T-1`` run, over a copy of the corrupted prefix
        cache cropped to ``t0`` tokens (row b uses sample ``sample_r[b]``'s prefix).
        """
        dev = self.ids.device
        hooks = [self._noise_hook(sample_r, t0)]
        for name, k, j, rows, ts in spec:
            rows_d, ts_d = rows.to(dev), ts.to(dev)
            vals = self.clean[(k, j)][ts_d + t0]

            def restore(act, hook, rows_d=rows_d, ts_d=ts_d, vals=vals, k=k):
                state_view(self.model, k, act)[rows_d, ts_d] = vals.to(act.dtype)
                return act

            hooks.append((name, restore))
        hooks.append(("unembed.hook_in", _keep_last))
        tokens = repeat(self.ids[:, t0:], "1 t -> s t", s=sample_r.numel())
        kwargs = {}
        if cache is not None:
            past = copy.deepcopy(cache)
            past.crop(t0 - self.T)
            past.batch_select_indices(sample_r.to(dev))
            kwargs["past_key_values"] = past
        logits = self.model.run_with_hooks(tokens, fwd_hooks=hooks, **kwargs)
        return logits[:, -1].float().softmax(-1)[:, self.o].cpu()


def state_view(model: Model, kind: str, act: Tensor) -> Tensor:
    """A traced state with the batch first, positions second (a view): AltUp's block output
    (``[streams, batch, pos, d]``, :func:`~capinterp.arch.forward.batch_first`) for ``"resid"``."""
    return batch_first(model, act) if kind == "resid" else act
