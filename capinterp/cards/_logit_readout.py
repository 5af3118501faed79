"""The read-out half of a unit's direct logit effect: a residual-stream direction to per-token logits.

A unit (a neuron's value vector, a head's OV output, an expert's summed value vectors) writes a
direction ``v`` into the residual stream at layer ``l``. Its direct effect on the logits is what the
steps between that write and the logits do to ``v`` when they act linearly on it:

* ``norms="fold"`` (RMSNorm models): ``v * g_post`` where the block normalizes the sublayer's output
  (Gemma's post-FFN / post-attention norms), then ``* g_final`` (the final norm's gain; Gemma's
  ``1 + w`` offset is read off the module by :func:`capinterp.localizers.dcsn.rms_gain`). A norm
  divides by the RMS of the *whole* stream, which no single unit fixes: as DCSN's ``"fold"`` does,
  each norm's scale is frozen, here at 1, so the effect is exact up to the positive factor
  ``1 / (s_post * s_final)`` of a given forward pass, which leaves the token ranking unchanged.
  LayerNorm models: the final LayerNorm's centring ``v - mean(v)`` and gain (read off the module by
  RelP's norm reader), scale frozen at 1 likewise.
* ``norms="raw"``: ``v`` itself (the paper DCSN's ``W_out @ W_U``).

Then ``@ W_U`` (the unembedding's bias left out: it is the same for every unit), then the linear
factors the family record holds (:func:`capinterp.localizers.dcsn.direct_gain`'s residual / FFN /
logit multipliers for FFN units; the residual and attention-output multipliers for heads) and
Gemma 4's layer scales (:func:`capinterp.localizers.dcsn.layer_scales`). A final soft-cap
(Gemma 2 / 3: ``cap * tanh(x / cap)``) is monotone, so the ranking is the same before and after it:
the values reported are the pre-soft-cap ones.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from capinterp.arch.family import UnsupportedFamily, family_of
from capinterp.core.offload import weights_readable
from capinterp.core.protocol import Model
from capinterp.localizers.dcsn import NORMS, fold_for, layer_scales, rms_gain

__all__ = ["Readout", "logits_of", "norm_gain", "ranked", "readout", "token_string"]

_VOCAB_CHUNK = 32768  # unembedding columns cast to float32 at a time (bounds memory on 256k vocabularies)


@dataclass(frozen=True)
class Readout:
    """How directions written at a layer reach the logits (see the module docstring)."""

    norms: str  # "raw" or "fold"
    centre: bool  # LayerNorm model, "fold": centre the direction before the final gain
    final: Tensor | None  # the final norm's gain ("fold"), None for "raw"
    post_ffn: tuple[Tensor | None, ...]  # per layer, the post-FFN norm's gain ("fold" and where the block has one)
    post_attn: tuple[Tensor | None, ...]  # per layer, the post-attention norm's gain (likewise)
    later: tuple[float, ...]  # per layer, the residual's later scales (Gemma 4), 1 elsewhere

    def directions(self, v: Tensor, layer: int, sublayer: str) -> Tensor:
        """``v`` ``[n, d_model]`` (float32) written by ``sublayer`` ("ffn" / "attn") of ``layer``, as the
        unembedding reads it: post norm's gain, centring, final gain, and the later layer scales."""
        v = v.float()
        post = (self.post_ffn if sublayer == "ffn" else self.post_attn)[layer]
        if post is not None:
            v = v * post.to(v.device)
        if self.centre:
            v = v - v.mean(-1, keepdim=True)
        if self.final is not None:
            v = v * self.final.to(v.device)
        return v * self.later[layer]

    def terms(self, layer: int, sublayer: str) -> str:
        """The factors :meth:`directions` applies, in words (for a card's ``definition``)."""
        parts = []
        if (self.post_ffn if sublayer == "ffn" else self.post_attn)[layer] is not None:
            parts.append(f"the post-{'FFN' if sublayer == 'ffn' else 'attention'} norm's gain")
        if self.centre:
            parts.append("centred (final LayerNorm)")
        if self.final is not None:
            parts.append("the final norm's gain")
        if self.later[layer] != 1.0:
            parts.append(f"the later layer scales ({self.later[layer]:.4g})")
        return " * ".join(parts) + " (norm scales frozen at 1)" if parts else "no norm folded"


def norm_gain(model: Model, module: torch.nn.Module) -> tuple[Tensor, bool]:
    """``(gain, centred)`` of a norm module: an RMSNorm's gain (:func:`capinterp.localizers.dcsn.rms_gain`,
    Gemma's ``1 + w`` included), or a LayerNorm's gain and True (read off the module by RelP's norm
    reader, which checks it is ``gain * centred x / std + bias``)."""
    if not str(getattr(model.cfg, "normalization_type", "")).startswith("LN"):
        return rms_gain(module, int(model.cfg.d_model)), False
    from capinterp.circuits.relp import _Norm

    norm = _Norm(type(module).__name__, getattr(module, "original_component", None) or module)
    if not norm.centre:
        raise ValueError(f"norms='fold': a norm of this LayerNorm model ({type(module).__name__}) reads as an RMSNorm")
    return norm.gain.float(), True


def _layernorm_readout(model: Model, later: tuple[float, ...]) -> Readout:
    if any(hasattr(b, "ln1_post") or hasattr(b, "ln2_post") for b in model.blocks):
        fam = family_of(model)
        raise UnsupportedFamily(f"norms='fold' on {fam.name}: post-sublayer LayerNorms are not folded; use norms='raw'")
    n = len(model.blocks)
    return Readout("fold", True, norm_gain(model, model.ln_final)[0], (None,) * n, (None,) * n, later)


def readout(model: Model, norms: str) -> Readout:
    """The :class:`Readout` of ``model`` for ``norms`` (one of ``"raw"``, ``"fold"``)."""
    if norms not in NORMS:
        raise ValueError(f"norms must be one of {', '.join(NORMS)}, got {norms!r}")
    n = len(model.blocks)
    later = tuple(layer_scales(model))
    if norms == "raw":
        return Readout("raw", False, None, (None,) * n, (None,) * n, later)
    if str(getattr(model.cfg, "normalization_type", "")).startswith("LN"):
        return _layernorm_readout(model, later)
    fold = fold_for(model, "fold")  # RMSNorm models: DCSN's gains (and its refusals: streams, split experts)
    assert fold is not None
    post_ffn, final, _ = fold
    d = int(model.cfg.d_model)
    post_attn = tuple(rms_gain(b.ln1_post, d) if hasattr(b, "ln1_post") else None for b in model.blocks)
    return Readout("fold", False, final, tuple(post_ffn), post_attn, later)


@torch.no_grad()
def logits_of(model: Model, directions: Tensor) -> Tensor:
    """``directions @ W_U`` ``[n, d_vocab]`` in float32 (no unembedding bias), the vocabulary in chunks."""
    with weights_readable(model.unembed):
        w_u = model.W_U
        out = torch.empty(directions.shape[0], w_u.shape[1], device=w_u.device)
        d = directions.float().to(w_u.device)
        for a in range(0, w_u.shape[1], _VOCAB_CHUNK):
            out[:, a : a + _VOCAB_CHUNK] = d @ w_u[:, a : a + _VOCAB_CHUNK].float()
    return out


def token_string(model: Model, token: int) -> str:
    """The token as text (the tokenizer's decoding), or ``<id>`` where the model has no tokenizer."""
    tok = getattr(model, "tokenizer", None)
    return str(tok.decode([token])) if tok is not None else f"<{token}>"


def ranked(model: Model, effect: Tensor, k: int) -> tuple[tuple, tuple]:
    """``(promoted, suppressed)``: the ``k`` largest entries of ``effect`` ``[d_vocab]``, largest first, and the
    ``k`` smallest, smallest first, each as ``(token string, token id, value)``."""
    top = torch.topk(effect, k)
    bottom = torch.topk(-effect, k)
    up = tuple((token_string(model, int(i)), int(i), float(v)) for v, i in zip(top.values, top.indices))
    down = tuple((token_string(model, int(i)), int(i), -float(v)) for v, i in zip(bottom.values, bottom.indices))
    return up, down
