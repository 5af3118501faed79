"""An attention head's OV circuit in low-rank factors, never a vocabulary x vocabulary matrix.

``A = X W_V[h]^T`` ``[d_vocab, d_head]`` (the source tokens' values) and ``B`` ``[d_head, d_vocab]``
(each value coordinate's direct logit effect through ``W_O[h]``), so that source ``s``'s logit
effect is ``A[s] @ B`` (:mod:`capinterp.cards.logit_effect`)."""

from __future__ import annotations

import torch
from torch import Tensor

from capinterp.arch.family import UnsupportedFamily, family_of
from capinterp.arch.linear import linear_layout
from capinterp.cards._logit_readout import Readout, logits_of, norm_gain
from capinterp.core.offload import weights_readable
from capinterp.core.protocol import Model

__all__ = ["head_slices", "ov_factors", "strongest_source"]

_ROWS = 16384  # embedding rows normalized and projected at a time


def head_slices(model: Model, layer: int, head: int) -> tuple[Tensor, Tensor]:
    """``(W_V[h] [d_head, d_model], W_O[h] [d_model, d_head])`` of head ``head`` of ``layer``: its key/value
    group's rows of the value projection and its columns of the output projection, in float32, whatever
    the storage (``nn.Linear`` or ``Conv1D``, read through :func:`capinterp.arch.linear.linear_layout`)."""
    fam = family_of(model)
    attn = model.blocks[layer].attn
    v, o = (getattr(getattr(attn, c, None), "original_component", None) for c in ("v", "o"))
    if v is None or o is None or not isinstance(getattr(v, "weight", None), Tensor):
        raise UnsupportedFamily(f"{fam.name}: layer {layer}'s attention exposes no separate value / output projection")
    if getattr(getattr(attn, "original_component", attn), "v_norm", None) is not None:
        raise UnsupportedFamily(
            f"{fam.name}: layer {layer} normalizes its values (v_norm): the OV circuit is not linear"
        )
    dh, group = fam.d_head, head // (fam.n_heads // fam.n_kv_heads)
    with weights_readable(v, o):
        w_v, w_o = linear_layout(v).float(), linear_layout(o).float()  # [n_kv * d_head, d_model], [d_model, H * d_head]
    if w_v.shape[0] != fam.n_kv_heads * dh or w_o.shape[1] != fam.n_heads * dh:
        raise UnsupportedFamily(
            f"{fam.name}: layer {layer}'s value / output projections are {tuple(w_v.shape)} / {tuple(w_o.shape)}, "
            f"not {fam.n_kv_heads} / {fam.n_heads} heads of {dh}"
        )
    return w_v[group * dh : (group + 1) * dh].clone(), w_o[:, head * dh : (head + 1) * dh].clone()


@torch.no_grad()
def ov_factors(
    model: Model, layer: int, head: int, ro: Readout, tokens: list[int] | None = None
) -> tuple[Tensor, Tensor]:
    """``(A, B)`` of the module docstring; with ``ro.norms == "fold"`` each embedding goes through the
    block's input norm first as if it were the whole residual (its gain; centred on a LayerNorm model).
    ``tokens``: only these rows of ``A`` (in that order), not the whole vocabulary's."""
    w_v, w_o = head_slices(model, layer, head)
    ln1 = getattr(model.blocks[layer], "ln1", None)
    gain, centre = norm_gain(model, ln1) if ro.norms == "fold" and ln1 is not None else (None, False)
    with weights_readable(model.embed):
        w_e = model.W_E if tokens is None else model.W_E[torch.tensor(tokens, device=model.W_E.device)]
        a = torch.empty(w_e.shape[0], w_v.shape[0], device=w_v.device)
        for i in range(0, w_e.shape[0], _ROWS):
            x = w_e[i : i + _ROWS].float().to(w_v.device)
            if gain is not None:
                x = x - x.mean(-1, keepdim=True) if centre else x
                x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True).clamp_min(1e-12)) * gain.to(x.device)
            a[i : i + _ROWS] = x @ w_v.T
    b = logits_of(model, ro.directions(w_o.T, layer, "attn"))
    return a, b.to(a.device)


def strongest_source(a: Tensor, b: Tensor) -> int:
    """The source token whose OV output moves the logits most: the largest norm of ``(A B)[s]`` centred over
    the vocabulary, through ``||c_s||^2 = A[s] (B_c B_c^T) A[s]^T`` (no ``d_vocab x d_vocab`` product)."""
    bc = b - b.mean(1, keepdim=True)
    return int(((a @ (bc @ bc.T)) * a).sum(1).argmax())
