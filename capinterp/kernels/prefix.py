"""Running only what changes: prefix reuse and layer-staircase forwards for the IG kernel.

Integrated gradients replaces ``hook_post`` of one layer at a few trailing positions (the
"suffix", positions ``p0..T-1``) and reads the logits there. Everything before ``p0`` and
every layer below the replaced one is identical to the clean run, so it is computed once:

1. :func:`clean_suffix` runs the prefix once (HF KV cache via ``return_type="logits_and_cache"``),
   then the suffix once with that cache, recording what each block received (its input
   residual and its call arguments: rotary tables, mask, ...), the prefix keys/values each
   attention layer read, the clean ``hook_post`` activations and the clean logits.
2. :func:`stair_logits` (route "fast") runs many rows at once by calling the bridge's blocks
   directly. Rows scaled at layer ``l`` join the batch at block ``l`` (entering with the
   recorded clean residual), so block ``j`` only runs the rows scaled at layers ``<= j``:
   no row ever recomputes the layers below its own. Rows are folded into the sequence
   dimension (batch 1, ``rows*S`` positions, rotary tables tiled, a block-diagonal mask over
   the suffix keys), so every row reads the one recorded prefix K/V without copies. Hooks
   still fire (the blocks are the bridge's), and the replaced activation enters through the
   ordinary ``hook_post`` hook point. Block calls are recorded by the wrapped layer's own
   signature (the cache under whatever name it takes), and per-key position biases (ALiBi) are
   folded like the mask. Attention that windows by absolute position inside the module
   (GPT-Neo's local layers, the family record's ``module_window``) would be cut by the folded
   positions: there the rows go in the batch dimension instead, each reading the prefix K/V.
   Where the prefix leaves a state of its own (a hybrid's Mamba, linear-attention or convolution
   mixers; DeepSeek-V4's compressed attention) the rows go in the batch dimension too, and each
   block call gets a fresh copy of the prefix's cache for its layer repeated per row, which the
   layer advances in place; the suffix runs at explicit positions, and
   :func:`clean_suffix` checks that continuing from the prefix's state gives the full forward's
   logits (transformers' continuation is not exact on every family).
   :func:`stair_supported` checks on each model that this reproduces the model's own logits.
3. :func:`bridge_logits` (route "prefix") is the plain bridge route: a widened copy of the
   prefix cache and ``run_with_hooks(suffix, past_key_values=...)``; every row runs every
   block. It is the fallback when :func:`stair_supported` finds that direct block calls do
   not reproduce the model's own logits for an architecture.

Logits are only ever computed at the suffix positions, which are all read.
"""

from __future__ import annotations

import copy
import functools
import inspect
from dataclasses import dataclass, field
from typing import Any

import torch
from einops import rearrange
from jaxtyping import Float, Int

from capinterp.arch.forward import batch_first, block_layout, collapse_streams
from capinterp.arch.forward import unembed as _unembed
from capinterp.arch.model import neuron_hook
from capinterp.core.protocol import Model
from capinterp.kernels.prefix_state import (
    continuation_error,
    saved_states,
    state_rows,
    tolerance,
    unshared_state,
)

__all__ = [
    "CleanSuffix",
    "NoCache",
    "Unsupported",
    "bridge_logits",
    "clean_suffix",
    "fallback_warning",
    "spy_prefix_kv",
    "stair_logits",
    "stair_supported",
]


@dataclass
class CleanSuffix:
    """The clean run of one sequence, split at ``p0`` (see module docstring)."""

    suffix: torch.Tensor  # [1, S] token ids from p0 on
    acts: torch.Tensor  # [n_layers, S, d_mlp] clean hook_post at the suffix positions
    logits: torch.Tensor  # [S, V] clean logits at the suffix positions
    resid: list[torch.Tensor] = field(default_factory=list)  # per block: input hidden [1, S, d]
    calls: list[tuple[tuple, dict]] = field(default_factory=list)  # per block: (args, kwargs) minus hidden
    prefix_kv: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    cache: Any = None  # pristine prefix cache (kept for the bridge route, and on hybrids for their mixers' state)
    positions: torch.Tensor | None = None  # [1, S] position ids given to a hybrid's continuation (else the model's)
    memo: dict = field(default_factory=dict)  # folded masks / rotary tables by (source id, rows)

    @property
    def n_pos(self) -> int:
        return int(self.suffix.shape[1])

    @property
    def stateful(self) -> bool:
        """The prefix leaves a state of its own (a hybrid's mixers, compressed attention): the rows each
        continue from a copy of it, at the explicit ``positions``."""
        return self.positions is not None


class _PrefixKV:
    """Stand-in for the HF cache in direct block calls: prepends the recorded prefix K/V.

    The rows are folded into the sequence (batch 1), so the prefix is neither copied per row
    nor written to; one object serves every chunk.
    """

    def __init__(self, prefix_kv: dict[int, tuple[torch.Tensor, torch.Tensor]]):
        self.prefix_kv = prefix_kv

    def get_seq_length(self, layer_idx: int = 0) -> int:
        kv = self.prefix_kv.get(layer_idx)
        return 0 if kv is None else int(kv[0].shape[-2])

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        kv = self.prefix_kv.get(layer_idx)
        if kv is None:
            return key_states, value_states
        k, v = kv
        if key_states.shape[0] != k.shape[0]:  # batch layout: every row reads the same prefix
            k, v = k.expand(key_states.shape[0], *k.shape[1:]), v.expand(value_states.shape[0], *v.shape[1:])
        return torch.cat([k, key_states], dim=-2), torch.cat([v, value_states], dim=-2)


class NoCache(RuntimeError):
    """The model gives no reusable KV cache (e.g. TransformerLens-native models)."""


def _prefix_forward(model: Model, prefix: torch.Tensor):
    """HF cache of ``prefix`` ([1, p0]); logits kept for the last position only when supported."""
    # use_cache=True: some configs default to no cache (MPT's use_cache=False), which the
    # bridge would otherwise honour and return none
    try:
        _, cache = model(prefix, return_type="logits_and_cache", logits_to_keep=1, use_cache=True)
    except TypeError:  # a model whose forward has no logits_to_keep
        _, cache = model(prefix, return_type="logits_and_cache", use_cache=True)
    if cache is not None and not callable(getattr(cache, "update", None)):
        cache = None
    if cache is None:
        raise NoCache("the model returned no KV cache for the prefix")
    return cache


def _is_cache(value: Any) -> bool:
    return callable(getattr(value, "update", None)) and hasattr(value, "get_seq_length")


def _split_call(block, args: tuple, kwargs: dict) -> tuple[torch.Tensor, tuple, dict]:
    """``(hidden, other positional args, kwargs)`` of one block call, the KV cache taken out.

    Positional arguments are bound to the wrapped transformers layer's own signature, so a
    family that passes its cache or mask positionally (GPT-2: ``(hidden, past_key_values,
    attention_mask, ...)``; XGLM: ``(hidden, attention_mask, ...)``) is recorded by name like
    any other. The cache, whatever its parameter is called (``past_key_values``,
    ``layer_past``), is dropped and its name kept under :data:`_CACHE_ARG` for the direct calls.
    """
    kwargs = dict(kwargs)
    rest: tuple = ()
    if args:
        target = getattr(block, "original_component", None) or block
        try:
            sig = inspect.signature(type(target).forward)  # the class's: the bridge wraps the instance's
            sig = sig.replace(parameters=list(sig.parameters.values())[1:])  # without self
            bound = sig.bind_partial(*args, **kwargs).arguments
        except (TypeError, ValueError):  # unbindable: keep the positional layout (direct calls may fail the check)
            hidden, rest = args[0], tuple(args[1:])
        else:
            kwargs = {}
            for name, value in bound.items():
                kind = sig.parameters[name].kind
                if kind is inspect.Parameter.VAR_KEYWORD:
                    kwargs.update(value)
                elif kind is inspect.Parameter.VAR_POSITIONAL:
                    rest = tuple(value)
                else:
                    kwargs[name] = value
            first = next(iter(sig.parameters))
            hidden = kwargs.pop(first)
    else:
        hidden = kwargs.pop("hidden_states")
    caches = [k for k, v in kwargs.items() if _is_cache(v) or k == "past_key_values"]
    for k in caches:
        kwargs.pop(k)
    kwargs[_CACHE_ARG] = next((k for k in caches if k != "past_key_values"), "past_key_values")
    return hidden, rest, kwargs


#: key of a recorded call's kwargs naming the parameter the block takes its KV cache under
_CACHE_ARG = "__capinterp_cache_arg__"


def clean_suffix(model: Model, seq: Int[torch.Tensor, " T"], p0: int, *, keep_cache: bool = False) -> CleanSuffix:
    """Clean run of ``seq`` ([T] ids) split at ``p0``; records everything the suffix rows need."""
    device = torch.device(model.cfg.device)
    tokens = seq.to(device).view(1, -1)
    n_layers = len(model.blocks)
    S = tokens.shape[1] - p0
    # a hybrid's mixers and DeepSeek-V4's compressed attention leave a state of their own: the suffix continues
    # from it, at explicit positions (some families, Bamba, count positions from 0 in a forward given a cache
    # without them), and the rows each get a copy of it (stair_logits)
    stateful = unshared_state(model) is not None
    positions = torch.arange(p0, p0 + S, device=device)[None] if stateful else None
    with torch.no_grad():
        cache = _prefix_forward(model, tokens[:, :p0]) if p0 > 0 else None
        pristine = copy.deepcopy(cache) if (keep_cache or stateful) and cache is not None else None
        prefix_kv = spy_prefix_kv(cache) if cache is not None else {}
        resid: list[Any] = [None] * n_layers
        calls: list[Any] = [None] * n_layers
        acts: list[Any] = [None] * n_layers

        def pre(j, module, args, kwargs):
            if resid[j] is not None:
                raise RuntimeError(f"block {j} ran twice in one forward; use route='prefix' or 'loop'")
            hidden, rest, kwargs = _split_call(module, args, kwargs)
            resid[j] = batch_first(model, hidden.detach())  # [1, S, (streams,) d]
            calls[j] = (rest, kwargs)

        def grab(l, act, hook):
            acts[l] = act[0].detach().clone()

        handles = [
            blk.register_forward_pre_hook(functools.partial(pre, j), with_kwargs=True)
            for j, blk in enumerate(model.blocks)
        ]
        try:
            logits = model.run_with_hooks(
                tokens[:, p0:],
                past_key_values=cache,
                fwd_hooks=[(neuron_hook(l), functools.partial(grab, l)) for l in range(n_layers)],
                **({} if positions is None else {"position_ids": positions}),
            )
        finally:
            for h in handles:
                h.remove()
        if stateful and p0 > 0 and (why := continuation_error(model, tokens, logits[0, -S:], acts[0].dtype)):
            raise NoCache(why)
    if any(a is None for a in acts):
        raise RuntimeError("some hook_post hooks did not fire on the suffix run")
    return CleanSuffix(
        suffix=tokens[:, p0:],
        acts=torch.stack(acts),
        logits=logits[0, -S:].detach(),
        resid=resid,
        calls=calls,
        prefix_kv=prefix_kv,
        cache=pristine,
        positions=positions,
    )


def _replace_rows(z: torch.Tensor, start: int, act: torch.Tensor, hook) -> torch.Tensor:
    """Hook (batch layout): rows ``start..start+len(z)`` of ``act`` become ``z``."""
    c = z.shape[0]
    if c == act.shape[0]:
        return z.to(act.dtype)
    return torch.cat([act[:start], z.to(act.dtype), act[start + c :]], dim=0)


def _replace_tail(z: torch.Tensor, act: torch.Tensor, hook) -> torch.Tensor:
    """Hook (folded layout [1, rows*S, d]): the last ``z.shape[1]`` positions become ``z``."""
    n = z.shape[1]
    if n == act.shape[1]:
        return z.to(act.dtype)
    return torch.cat([act[:, :-n], z.to(act.dtype)], dim=1)


class Unsupported(ValueError):
    """The recorded block call cannot be folded (unexpected mask or rotary layout)."""


def _fold_mask(mask: torch.Tensor | None, n_pre: int, S: int, R: int, device) -> torch.Tensor:
    """[1, 1, R*S, n_pre + R*S]: every row's S queries see the prefix and their own S keys only.

    The prefix columns and the S x S block are copied from the recorded 4-D mask (so sliding
    windows and the like carry over); keys of other rows are masked.
    """
    if mask is None:
        pre = torch.ones(S, n_pre, dtype=torch.bool, device=device)
        own = torch.ones(S, S, dtype=torch.bool, device=device).tril()
        hidden: Any = False
    else:
        if mask.ndim != 4 or mask.shape[0] != 1 or mask.shape[1] != 1 or mask.shape[-2] != S:
            raise Unsupported(f"attention mask of shape {tuple(mask.shape)}")
        m = mask[0, 0]
        pre, own = m[:, : m.shape[-1] - S], m[:, m.shape[-1] - S :]
        # a query always sees its own key: that entry says which value means "visible" (bool
        # masks are True-visible for most families, True-masked for MPT's masked_fill)
        hidden = (not bool(own[-1, -1])) if m.dtype == torch.bool else torch.finfo(m.dtype).min
    same_row = torch.block_diag(*[torch.ones(S, S, dtype=torch.bool, device=device)] * R)
    suffix = torch.where(same_row, own.repeat(R, R), torch.tensor(hidden, dtype=own.dtype, device=device))
    return torch.cat([pre.repeat(R, 1), suffix], dim=1)[None, None]


def _tile(t: torch.Tensor, R: int, S: int, dim: int) -> torch.Tensor:
    if t.shape[dim] != S:
        raise Unsupported(f"per-position tensor of shape {tuple(t.shape)} (suffix length {S})")
    reps = [1] * t.ndim
    reps[dim] = R
    return t.repeat(*reps)


#: per-key position biases (ALiBi): BLOOM's ``alibi`` [heads, 1, keys], MPT's ``position_bias``
_PER_KEY = ("alibi", "position_bias")


def _fold_keys(bias: torch.Tensor, n_pre: int, S: int, R: int) -> torch.Tensor:
    """A per-key bias for the folded keys: the prefix keys', then the suffix keys' once per row.

    Only the last ``n_pre + S`` entries are the run's keys (MPT's table covers the maximum
    length and is read from its end). ALiBi adds a per-key term, so each row's copy of the
    suffix keys carries the same bias as in the clean run.
    """
    if bias.shape[-1] < n_pre + S:
        raise Unsupported(f"per-key bias of shape {tuple(bias.shape)} ({n_pre} prefix + {S} suffix keys)")
    keys = bias[..., bias.shape[-1] - n_pre - S :]
    reps = [1] * bias.ndim
    reps[-1] = R
    return torch.cat([keys[..., :n_pre], keys[..., n_pre:].repeat(*reps)], dim=-1)


def _memo(run: CleanSuffix, key, make):
    if key not in run.memo:
        run.memo[key] = make()
    return run.memo[key]


def _folded_call(run: CleanSuffix, j: int, R: int) -> tuple[tuple, dict]:
    """Block ``j``'s recorded call arguments, rewritten for R rows folded into the sequence."""
    args, kwargs = run.calls[j]
    S, kw = run.n_pos, dict(kwargs)
    mask = kw.get("attention_mask")
    n_pre = run.prefix_kv[j][0].shape[-2] if j in run.prefix_kv else 0
    kw["attention_mask"] = _memo(
        run, ("mask", id(mask), n_pre, R), lambda: _fold_mask(mask, n_pre, S, R, run.suffix.device)
    )
    pe = kw.get("position_embeddings")
    # one table (DeepSeek-V2's complex [batch, pos, rotary / 2] freqs_cis), (cos, sin), or such per rope
    # kind (DeepSeek-V4's {"main": (cos, sin), "compress": ...})
    if pe is not None:
        kw["position_embeddings"] = _memo(run, ("pe", id(pe), R), lambda: _map_tables(pe, lambda t: _tile(t, R, S, -2)))
    for name in _PER_KEY:
        bias = kw.get(name)
        if isinstance(bias, torch.Tensor):
            kw[name] = _memo(run, (name, id(bias), n_pre, R), lambda b=bias: _fold_keys(b, n_pre, S, R))
    for name in ("position_ids", "cache_position", "input_ids"):  # input_ids: DeepSeek-V4's hash routing
        if isinstance(kw.get(name), torch.Tensor):
            kw[name] = _memo(run, (name, id(kw[name]), R), lambda t=kw[name]: _tile(t, R, S, -1))
    for name in _PER_POSITION:
        if isinstance(kw.get(name), torch.Tensor):
            kw[name] = _memo(run, (name, id(kw[name]), R), lambda t=kw[name]: _tile(t, R, S, 1))
    return args, kw


#: per-position inputs of a block besides the residual, ``[1, S, ...]``, the same for every row (they
#: are the tokens', not the residual's): Gemma 4's per-layer embeddings
_PER_POSITION = ("per_layer_input",)


def _batched_call(run: CleanSuffix, j: int, R: int) -> tuple[tuple, dict]:
    """Block ``j``'s recorded call arguments for R rows in the batch dimension (each row a copy
    of the clean suffix call): the layout for attention that windows by absolute position."""
    args, kwargs = run.calls[j]
    kw = dict(kwargs)

    def rows(t: torch.Tensor, name: str) -> torch.Tensor:
        if t.shape[0] != 1:
            raise Unsupported(f"{name} of shape {tuple(t.shape)} (batch 1 expected)")
        return t.repeat(R, *[1] * (t.ndim - 1))

    for name, value in list(kw.items()):
        if name == "cache_position" or not isinstance(value, torch.Tensor):
            continue
        if name in _PER_KEY:  # ALiBi [batch * heads, 1, keys]: rows are batch-major
            kw[name] = _memo(run, (name, id(value), "batch", R), lambda v=value: v.repeat(R, *[1] * (v.ndim - 1)))
        else:
            kw[name] = _memo(run, (name, id(value), "batch", R), lambda v=value, n=name: rows(v, n))
    pe = kw.get("position_embeddings")
    if isinstance(pe, (tuple, dict)):
        kw["position_embeddings"] = _memo(
            run, ("pe", id(pe), "batch", R), lambda: _map_tables(pe, lambda t: rows(t, "pe"))
        )
    return args, kw


def _map_tables(pe: Any, fn: Any) -> Any:
    """``fn`` on every tensor of a rotary table: one tensor, a (cos, sin) tuple, or a dict of those."""
    if isinstance(pe, torch.Tensor):
        return fn(pe)
    if isinstance(pe, dict):
        return {k: _map_tables(v, fn) for k, v in pe.items()}
    return tuple(_map_tables(t, fn) for t in pe)


def _batch_layout(model: Model) -> bool:
    """Rows in the batch dimension instead of folded into the sequence: for attention modules that
    apply a window by absolute position themselves (the family record's ``module_window``), which
    the folded positions would cut. Every row then reads a per-row view of the prefix K/V. (Rows continuing
    a prefix's own state go there too, :func:`stair_logits`: in one sequence it would pass from row to row.)"""
    from capinterp.arch.family import family_of

    return family_of(model).module_window is not None


#: the keyword under which a layer reads keys and values an earlier layer stored in the same forward
#: (Gemma 4's KV-sharing layers, num_kv_shared_layers)
_SHARED_KV = "shared_kv_states"


def _shared_store() -> Any:
    """An empty store of shared keys and values of transformers' own type (``KVSharingDict``, which
    accelerate moves in place between devices, where a plain dict would be copied and the keys a layer
    stores lost), a dict where transformers has none."""
    try:
        from transformers.cache_utils import KVSharingDict
    except ImportError:  # a transformers without KV sharing
        return {}
    return KVSharingDict()


def _shared_rows(shared: Any, clean: Any, R: int, S: int, batch: bool) -> Any:
    """``shared`` (the stair's own store, which its producer layers write) with keys and values for
    all ``R`` rows: a producer that ran in the stair stored them for the rows present then (the
    first ones: rows join at the end); the rows that joined after it, or every row where the producer
    ran below the stair's first block, are clean there, so they read the clean run's (``clean``, the
    recorded store: prefix, then the S suffix positions)."""
    for name, (k, v) in clean.items():
        have = shared.get(name)
        if batch:  # [rows, heads, prefix + S, d]: the clean rows appended
            n = 0 if have is None else have[0].shape[0]
            base, dim, fill = have or (k[:0], v[:0]), 0, [t.expand(R - n, *t.shape[1:]) for t in (k, v)]
        else:  # [1, heads, prefix + rows * S, d]: the clean suffix appended once per row
            pre = k.shape[-2] - S
            n = 0 if have is None else (have[0].shape[-2] - pre) // S
            base, dim = have or (k[..., :pre, :], v[..., :pre, :]), -2
            fill = [t[..., pre:, :].repeat(*[1] * (t.ndim - 2), R - n, 1) for t in (k, v)]
        shared[name] = (torch.cat([base[0], fill[0]], dim=dim), torch.cat([base[1], fill[1]], dim=dim))
    return shared


def _edit(z: torch.Tensor | None, eps: torch.Tensor | None, act: torch.Tensor, hook) -> torch.Tensor:
    """Hook (folded layout): the clean row (the first S positions) gets ``+ eps``, the rows that
    joined at this block (the tail) become ``z``."""
    if eps is not None:
        act = torch.cat([act[:, : eps.shape[1]] + eps.to(act.dtype), act[:, eps.shape[1] :]], dim=1)
    return act if z is None else _replace_tail(z, act, hook)


def _edit_batch(z: torch.Tensor | None, eps: torch.Tensor | None, act: torch.Tensor, hook) -> torch.Tensor:
    """:func:`_edit` for the batch layout: the rows are joined into one sequence and split back."""
    return _edit(z, eps, act.reshape(1, -1, act.shape[-1]), hook).reshape(act.shape)


def stair_logits(
    model: Model,
    run: CleanSuffix,
    groups: list[tuple[int, Float[torch.Tensor, "c S d_mlp"]]],
    at: int | None = None,
    clean: dict[int, Float[torch.Tensor, "1 S d_mlp"]] | None = None,
) -> Float[torch.Tensor, "R S V"]:
    """Logits [R, S, V] for rows whose layer-``l`` ``hook_post`` (all suffix positions) is ``z``.

    ``groups`` = [(layer, z [c, S, d_mlp]), ...] with strictly increasing layers; the rows are
    the groups' rows in order. Block ``j`` runs only the rows of groups with layer <= j. Rows
    are folded into the sequence dimension (batch 1, ``rows*S`` positions, a block-diagonal
    mask over the suffix keys), so every row reads the one shared prefix K/V. ``at``: unembed
    suffix position ``at`` only (logits [R, 1, V]; a 262k vocabulary makes all S costly).

    ``clean`` = {layer: eps [1, S, d_mlp]} adds one clean row in front (row 0), entering at the
    lowest of those layers, whose ``hook_post`` at each of them is the clean one plus ``eps``:
    with zero leaves, the gradient for each ``eps`` is the total derivative at the clean point
    (alpha = 1) of every layer at once, where the groups would need one row per layer.
    """
    layers = [l for l, _ in groups]
    if layers != sorted(set(layers)):
        raise ValueError("groups must have strictly increasing layers")
    clean = clean or {}
    if not layers and not clean:
        raise ValueError("nothing to run: no groups and no clean row")
    joining = dict(groups)
    cache = _PrefixKV(run.prefix_kv)
    h, R = None, 0
    batch = _batch_layout(model) or run.stateful  # rows each with their own copy of a prefix state
    shared = _shared_store()  # KV-sharing layers' keys and values, these rows
    hooks = [
        (
            neuron_hook(l),
            functools.partial(
                _edit_batch if batch else _edit,
                rearrange(joining[l], "c s d -> 1 (c s) d") if l in joining else None,
                clean.get(l),
            ),
        )
        for l in sorted({*layers, *clean})
    ]
    start = min([*layers, *clean])
    with model.hooks(fwd_hooks=hooks):
        for j in range(start, len(model.blocks)):
            if clean and j == min(clean):
                h, R = run.resid[j], 1
            if j in joining:
                c = joining[j].shape[0]
                new = run.resid[j].repeat(1, c, *[1] * (run.resid[j].ndim - 2))  # [1, S, (streams,) d]
                h = new if h is None else torch.cat([h, new], dim=1)
                R += c
            args, kwargs = (_batched_call if batch else _folded_call)(run, j, R)
            if _SHARED_KV in kwargs:
                kwargs[_SHARED_KV] = _shared_rows(shared, kwargs[_SHARED_KV], R, run.n_pos, batch)
            cache_arg = kwargs.pop(_CACHE_ARG, "past_key_values")
            assert h is not None  # block ``start`` is a joining or clean layer, which sets h
            x = block_layout(model, rearrange(h, "1 (r s) ... -> r s ...", r=R) if batch else h)
            if not run.stateful:  # keys and values only: every row reads the one recorded prefix
                out = model.blocks[j](x, *args, **kwargs, **{cache_arg: cache})
            elif run.cache is None:  # no prefix: no state to continue from
                out = model.blocks[j](x, *args, **kwargs, **{cache_arg: None})
            else:
                rows_cache = state_rows(run.cache, j, R)
                with saved_states(rows_cache, j):
                    out = model.blocks[j](x, *args, **kwargs, **{cache_arg: rows_cache})
            h = batch_first(model, out[0] if isinstance(out, (tuple, list)) else out)
            if batch:
                h = rearrange(h, "r s ... -> 1 (r s) ...")
    if h is None:  # unreachable: block ``start`` is a joining or clean layer, which sets h
        raise RuntimeError("stair_logits built no residual stream")
    h = collapse_streams(model, rearrange(h, "1 (r s) ... -> r s ...", r=R))
    return _unembed(model, h if at is None else h[:, at : at + 1])


def bridge_logits(
    model: Model, run: CleanSuffix, groups: list[tuple[int, Float[torch.Tensor, "c S d_mlp"]]]
) -> Float[torch.Tensor, "R S V"]:
    """Same contract as :func:`stair_logits`, through ``run_with_hooks`` with a widened prefix cache."""
    rows = sum(z.shape[0] for _, z in groups)
    cache, positions = None, {}
    if run.cache is not None:
        cache = copy.deepcopy(run.cache)  # a forward extends the cache in place: fresh copy per chunk
        if run.positions is None:  # keys and values only
            cache.batch_repeat_interleave(rows)
        else:  # every layer's keys and values and own states (a mixer's has no batch_repeat_interleave)
            cache.reorder_cache(torch.zeros(rows, dtype=torch.long))
            positions = {"position_ids": run.positions.expand(rows, -1)}
    hooks, start = [], 0
    for l, z in groups:
        hooks.append((neuron_hook(l), functools.partial(_replace_rows, z, start)))
        start += z.shape[0]
    logits = model.run_with_hooks(run.suffix.expand(rows, -1), past_key_values=cache, fwd_hooks=hooks, **positions)
    return logits[:, -run.suffix.shape[1] :]


def stair_supported(model: Model, run: CleanSuffix, rtol: float = 1e-4) -> bool:
    """Do direct block calls reproduce the model's own clean logits on this run?

    Tolerance: :func:`~capinterp.kernels.prefix_state.tolerance` (with a float32 tolerance in bfloat16 the fast route fell back to the
    slower prefix route on every short prompt of SmolLM2 and Gemma 3).
    """
    # rows joining at the first blocks and at the last (which reads, say, an earlier layer's shared keys)
    layers = sorted({*range(min(2, len(run.acts))), len(run.acts) - 1})
    groups = [(l, run.acts[l][None].expand(2, -1, -1)) for l in layers]
    try:
        with torch.no_grad():
            logits = stair_logits(model, run, groups)
    except Exception:
        return False
    ref = run.logits.float()
    tol = tolerance(run.logits, rtol, run.acts.dtype)
    return logits.shape[1:] == ref.shape and bool((logits.float() - ref).abs().max() <= tol)


def fallback_warning(model: Model) -> str:
    """The one-time warning when IG's fast route falls back to the bridge ("prefix") route."""
    from capinterp.arch.family import family_of

    return (
        f"IG on {family_of(model).name}: direct block calls did not reproduce the model's own logits, "
        "so IG uses the slower route='prefix' for this model (every row runs every block: "
        "several times the fast route's work; see docs/models.md, 'IG's fast route by family')"
    )


def spy_prefix_kv(cache: Any) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """Make ``cache`` (this object only) record, at each layer's next update, the keys and values it
    held before it (the prefix's): ``{layer_idx: (k, v)}``, filled as the continuation runs."""
    prefix_kv: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    real_update = cache.update

    def update(key_states, value_states, layer_idx, *args, **kwargs):
        k, v = real_update(key_states, value_states, layer_idx, *args, **kwargs)
        n = k.shape[-2] - key_states.shape[-2]
        prefix_kv[layer_idx] = (k[..., :n, :].detach(), v[..., :n, :].detach())
        return k, v

    cache.update = update  # instance attribute: this cache object only
    return prefix_kv
