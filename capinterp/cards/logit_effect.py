"""A unit's direct effect on the logits through the unembedding: the tokens it promotes and suppresses.

Each function maps a unit to one residual-stream direction and reads it out through the steps
after it (:mod:`capinterp.cards._logit_readout`: the norms' gains with ``norms="fold"``, ``W_U``,
the family record's multipliers, before any soft-cap); the ``definition`` of each
:class:`TokenEffect` says exactly what was multiplied.

* **Neuron** ``(l, i)``: its value vector, row ``i`` of layer ``l``'s down projection read as
  ``[d_mlp, d_model]`` (:func:`capinterp.arch.neuron_weights.value_rows`: ``nn.Linear`` or ``Conv1D``
  storage, a mixture-of-experts layer's experts flat, expert-major): the logit change per unit of
  activation.
* **Head** ``(l, h)`` (the OV circuit, Elhage et al. 2021, "A Mathematical Framework for Transformer
  Circuits"): for a source token ``s``, ``x_s = W_E[s]`` (with ``norms="fold"`` put through the
  block's input norm as if the residual were that embedding alone: ``g_1 * x_s / rms(x_s)``, centred
  first on a LayerNorm model), then head ``h``'s value slice ``W_V[h]`` (its key/value group under
  grouped-query attention) and output slice ``W_O[h]``: what the head writes when it attends fully
  to ``s``. Positional embeddings and the value / output biases are left out. With several sources the
  effect is their mean. Default source: the single token whose OV output moves the logits most (the
  largest norm of its effect over the vocabulary, centred over it, since a shift of every logit does
  nothing): ``|| (A B)[s] - mean ||`` for the low-rank factors ``A = X W_V[h]^T`` and ``B = W_O[h]^T W_U``
  costs ``O(d_vocab d_head^2)``, not a ``d_vocab x d_vocab`` matrix.
* **Expert** ``(l, e)`` of a mixture-of-experts layer: the sum of its neurons' value vectors, i.e. its
  output when each of its neurons has activation 1 and the router gives it weight 1 (biases left
  out): a static summary; the signs of a gated expert's activations vary by token, so with ``weights``
  (per expert, ``[d_expert]``, e.g. its neurons' mean activations on a corpus) the sum is weighted:
  the expert's mean output direction.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from capinterp.arch.expert_weights import ExpertValues
from capinterp.arch.experts import ExpertBlock, expert_block
from capinterp.arch.family import family_of, require_attention
from capinterp.arch.model import attention_layers
from capinterp.arch.neuron_weights import value_rows
from capinterp.arch.weights import down_projection
from capinterp.cards._logit_ov import ov_factors, strongest_source
from capinterp.cards._logit_readout import Readout, logits_of, ranked, readout, token_string
from capinterp.core.offload import weights_readable
from capinterp.core.protocol import Model
from capinterp.localizers.dcsn import direct_gain

__all__ = ["TokenEffect", "expert_logit_effects", "head_ov_effects", "neuron_logit_effects"]


@dataclass(frozen=True)
class TokenEffect:
    """One unit's direct effect on the logits through the unembedding."""

    unit: tuple  # (layer, neuron); ("head", layer, head); ("expert", layer, expert)
    promoted: tuple[tuple[str, int, float], ...]  # (token string, token id, effect), top k, largest first
    suppressed: tuple[tuple[str, int, float], ...]  # the k most negative, most negative first
    definition: str  # one line saying exactly what was multiplied
    sources: tuple[tuple[str, int], ...] = ()  # heads: the source tokens (string, id) whose OV output this is


def _pair(unit: Any, what: str) -> tuple[int, int]:
    if isinstance(unit, tuple) and len(unit) == 3 and unit[0] == what.rstrip("s"):
        unit = unit[1:]  # a tagged unit: ("head", layer, head) / ("expert", layer, expert)
    try:
        a, b = unit
        if isinstance(a, bool) or isinstance(b, bool):
            raise TypeError
        return operator.index(a), operator.index(b)
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be (layer, index) pairs of ints, got {unit!r:.80}") from None


def _k(model: Model, k: int) -> int:
    vocab = int(model.cfg.d_vocab)
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= vocab:
        raise ValueError(f"k must be an int in [1, {vocab}] (the vocabulary), got {k!r}")
    return k


def _tail(readout_: Readout, fam_gain: float, sublayer: str, layer: int, logit_softcap: float | None) -> str:
    cap = f"; before the final soft-cap ({logit_softcap:g}, monotone: same ranking)" if logit_softcap else ""
    return f"* {readout_.terms(layer, sublayer)} @ W_U (no bias) * {fam_gain:.6g} (family multipliers){cap}"


def neuron_logit_effects(model: Model, neurons: Iterable, *, k: int = 10, norms: str = "fold") -> list[TokenEffect]:
    """Per neuron ``(layer, index)``: the tokens its value vector promotes and suppresses (module docstring).

    ``norms``: ``"fold"`` (the norms' gains folded in, scales frozen) or ``"raw"`` (``W_out @ W_U``).
    ValueError for a neuron outside the model's ``n_layers x d_mlp`` (or on a layer's padding).
    """
    fam = family_of(model)
    units = [_pair(u, "neurons") for u in neurons]
    valid = fam.valid_neurons()
    for l, i in units:
        if not (0 <= l < fam.n_layers and 0 <= i < fam.d_mlp) or not bool(valid[l, i]):
            raise ValueError(f"neuron ({l}, {i}) is not one of this model's neurons ({fam.n_layers} x {fam.d_mlp})")
    k, ro, gain = _k(model, k), readout(model, norms), direct_gain(model)
    out: dict[tuple[int, int], TokenEffect] = {}
    for layer in sorted({l for l, _ in units}):
        idx = [i for l, i in units if l == layer]
        with weights_readable(model.blocks[layer].mlp):
            v = value_rows(model, layer)[torch.tensor(idx)].float()
        effects = logits_of(model, ro.directions(v, layer, "ffn")) * gain
        tail = _tail(ro, gain, "ffn", layer, fam.logit_softcap)
        for i, row in zip(idx, effects):
            what = f"value vector W_out[{layer}][{i}] (row of the down projection as [d_mlp, d_model]) {tail}"
            out[(layer, i)] = TokenEffect((layer, i), *ranked(model, row, k), f"{norms}: {what}")
    return [out[u] for u in units]


def _expert_rows(model: Model, layer: int, expert: int) -> Tensor:
    fam = family_of(model)
    if fam.moe is None or not getattr(model, "capinterp_experts", None):
        raise ValueError(
            f"{fam.name} is a dense model: it has no experts (expert effects need a mixture-of-experts model)"
        )
    if not 0 <= layer < fam.n_layers:
        raise ValueError(f"expert layer {layer} is outside this model's {fam.n_layers} layers")
    spec = expert_block(model, layer)
    if not isinstance(spec, ExpertBlock):
        raise ValueError(f"layer {layer} of {fam.name} is a dense layer (no experts)")
    if not 0 <= expert < spec.n_experts:
        raise ValueError(f"expert {expert} is outside layer {layer}'s {spec.n_experts} routed experts")
    proj = down_projection(model, layer)
    assert isinstance(proj, ExpertValues)
    d = spec.d_expert
    return proj.values()[expert * d : (expert + 1) * d].float()


def expert_logit_effects(
    model: Model, experts: Iterable, *, k: int = 10, norms: str = "fold", weights: Mapping | None = None
) -> list[TokenEffect]:
    """Per routed expert ``(layer, expert)``: the tokens its summed value vectors promote and suppress.

    ``weights``: optional ``{(layer, expert): [d_expert] tensor}`` weighting each neuron's value vector
    (default 1 each: the expert's output at unit activations, module docstring). ValueError on a dense
    model or layer, or an expert outside the layer.
    """
    fam = family_of(model)
    units = [_pair(u, "experts") for u in experts]
    k, ro, gain = _k(model, k), readout(model, norms), direct_gain(model)
    out = []
    for layer, e in units:
        rows = _expert_rows(model, layer, e)
        w = None if weights is None else weights.get((layer, e))
        if w is not None and tuple(torch.as_tensor(w).shape) != (rows.shape[0],):
            raise ValueError(f"weights[({layer}, {e})] must have shape ({rows.shape[0]},) (the expert's neurons)")
        summed = (rows if w is None else rows * torch.as_tensor(w, dtype=torch.float32)[:, None].to(rows.device)).sum(0)
        effect = logits_of(model, ro.directions(summed[None], layer, "ffn"))[0] * gain
        how = "weighted by the given weights" if w is not None else "each at activation 1, router weight 1"
        what = f"sum of expert {e}'s {rows.shape[0]} value vectors ({how}) {_tail(ro, gain, 'ffn', layer, fam.logit_softcap)}"
        out.append(TokenEffect(("expert", layer, e), *ranked(model, effect, k), f"{norms}: {what}"))
    return out


def _sources_for(model: Model, unit: tuple[int, int], sources: Any) -> list[int] | None:
    """The given source token ids of head ``unit`` (None: pick the strongest); ValueError outside the vocabulary."""
    if sources is None:
        return None
    ids = sources.get(unit) if isinstance(sources, Mapping) else sources
    if ids is None:
        return None
    ids = [int(t) for t in (ids.tolist() if isinstance(ids, Tensor) else ids)]
    n = int(model.W_E.shape[0])
    if not ids or not all(0 <= t < n for t in ids):
        raise ValueError(f"sources of head {unit} must be token ids in [0, {n}), got {ids!r:.80}")
    return ids


def head_ov_effects(
    model: Model, heads: Iterable, *, k: int = 10, sources: Any = None, norms: str = "fold"
) -> list[TokenEffect]:
    """Per head ``(layer, head)``: the tokens its OV circuit promotes and suppresses for its source tokens.

    ``sources``: token ids shared by every head, or ``{(layer, head): ids}``; the effect is the mean over
    them. Default (None, or a head missing from the mapping): the head's strongest source token (module
    docstring). UnsupportedFamily on a model without fixed softmax-attention heads in every layer;
    ValueError for a head outside the model.
    """
    fam = family_of(model)
    require_attention(fam, "head OV effects")
    units = [_pair(u, "heads") for u in heads]
    layers = set(attention_layers(model))
    for l, h in units:
        if l not in layers or not 0 <= h < fam.n_heads:
            raise ValueError(f"head ({l}, {h}) is not one of this model's {fam.n_layers} x {fam.n_heads} heads")
    k, ro = _k(model, k), readout(model, norms)
    gain = fam.residual_multiplier * fam.attn_out_multiplier * fam.logit_multiplier
    out = []
    for l, h in units:
        given = _sources_for(model, (l, h), sources)
        if given is None:  # the whole vocabulary's values, to find the strongest source
            a, b = ov_factors(model, l, h, ro)
            src = [strongest_source(a, b)]
            a = a[src]
        else:  # only the given sources' values
            a, b = ov_factors(model, l, h, ro, tokens=given)
            src = given
        effect = (a @ b).mean(0) * gain
        x = "ln1 gain * W_E[s] / rms (as if the residual were that embedding)" if ro.norms == "fold" else "W_E[s]"
        how = "the strongest source s" if given is None else f"mean over {len(src)} sources s"
        what = f"{how}: {x} @ W_V[{l}.{h}] @ W_O[{l}.{h}] {_tail(ro, gain, 'attn', l, fam.logit_softcap)}"
        named = tuple((token_string(model, t), t) for t in src)
        out.append(TokenEffect(("head", l, h), *ranked(model, effect, k), f"{norms}: {what}", named))
    return out
