"""DCSN: capability-specific neurons by activation x unembedding projection (the DCSN paper, anon. 2025, Eq. 1; docs/localizers/dcsn.md).

    C[l, i] = mean_j  a^l_{j,i} * (W_out[l] @ W_U)[i, t_j]

``a^l_{j,i}`` is neuron (l, i)'s activation (``hook_post``) at the last prompt token of sample
j, and ``t_j`` the first gold answer token (``target="gold"``) or the model's greedy prediction
(``target="pred"``, as FiNE does). The projection uses the *raw* weights (TransformerBridge
does no weight processing by default), so it is the neuron's direct effect on the target
logit through its value vector, ignoring the final norm (and, on Gemma 3, the post-FFN norm:
there it is only an approximation of the direct effect). Cost: one forward per prompt.
The mask is CNL's: ``|C - mean| > sigma * std``, global and two-sided.

``norms="fold"`` (RMSNorm models) folds the norms between a neuron and the logits into the
projection, with each norm's scale frozen at its value in the sample's forward pass:

    C[l, i] = mean_j  a^l_{j,i} * ((W_out[l, i] * g_post[l] / s_post[l, j]) * g_f / s_f[j]) @ W_U[:, t_j]

(``g`` a norm's elementwise gain, ``s`` its RMS at the last token; the post-FFN factor only where
the block has one, as Gemma 3 does). That is the neuron's exact direct effect on the target
logit with the scales held fixed, the quantity the raw projection approximates. On Gemma 3 the
post-FFN norm rescales each layer's MLP output by very different amounts, so the raw scores
over-weight some layers (layer 0: 73.5 % of the raw located neurons, docs/results.md).
"""

from __future__ import annotations

from typing import Any, ClassVar, cast

import torch
from jaxtyping import Float, Int
from torch import Tensor

from capinterp.arch.experts import branched
from capinterp.arch.family import UnsupportedFamily, family_of
from capinterp.arch.forward import capture, unembed
from capinterp.arch.model import neuron_hook, neuron_shape
from capinterp.arch.weights import down_projection
from capinterp.core.constraints import Options
from capinterp.core.offload import weights_readable
from capinterp.core.protocol import Model
from capinterp.core.tokens import Encoded, collate, pad_id
from capinterp.localizers.base import register
from capinterp.localizers.dataset import DatasetNeuronLocalizer

__all__ = [
    "DCSN",
    "NORMS",
    "fold_for",
    "folded_norms",
    "folded_projection",
    "last_token_activations",
    "per_sample_scores",
    "projection",
    "rms_gain",
    "unembed_columns",
]

NORMS: tuple[str, ...] = ("raw", "fold")


@torch.no_grad()
def last_token_activations(
    model: Model, items: list[Encoded], extra: tuple[str, ...] = ()
) -> (
    tuple[Float[Tensor, "n n_layers d_mlp"], Float[Tensor, "n d_vocab"]]
    | tuple[Float[Tensor, "n n_layers d_mlp"], Float[Tensor, "n d_vocab"], dict[str, Float[Tensor, "n ..."]]]
):
    """``hook_post`` of every layer at each prompt's last token: ``[n, n_layers, d_mlp]``, and logits there.

    With ``extra`` hook names, also returns ``{name: activation at the last token, [n, ...]}``.
    """
    n_layers, d_mlp = neuron_shape(model)
    batch = collate(items, pad_id(model.tokenizer), with_target=False, device=model.cfg.device)
    rows = torch.arange(len(items), device=batch.tokens.device)
    last = batch.lengths - 1
    acts = torch.empty(len(items), n_layers, d_mlp, device=batch.tokens.device)
    seen: dict[str, torch.Tensor] = {}

    def grab(act, hook):
        acts[:, int(hook.name.split(".")[1])] = act[rows, last].float()

    def keep(act, hook):
        seen[hook.name] = act[rows, last].float()

    def keep_final(act, hook):  # the final norm runs on the picked positions only: [n, 1, ...]
        seen[hook.name] = act[:, 0].float()

    final = [(n, keep_final) for n in extra if n.startswith("ln_final.")]
    hooks = [(neuron_hook(l), grab) for l in range(n_layers)] + [(n, keep) for n in extra if n not in dict(final)]
    resid = capture(model, batch.tokens, "ln_final.hook_in", hooks)
    with model.hooks(fwd_hooks=final):
        logits = unembed(model, resid[rows, last][:, None])[:, 0].float()
    return (acts, logits, seen) if extra else (acts, logits)


def rms_gain(norm: torch.nn.Module, d_model: int) -> Float[Tensor, " d_model"]:
    """The elementwise gain ``g`` of an RMSNorm (``x / rms(x) * g``), read off the module itself:
    an all-ones input has RMS 1, so ``norm(1) = g / sqrt(1 + eps)`` (relative error ~eps / 2)."""
    with weights_readable(norm):
        p = next(norm.parameters())
        return norm(torch.ones(1, 1, d_model, device=p.device, dtype=p.dtype))[0, 0].float()


def folded_norms(model: Model) -> tuple[list[torch.Tensor | None], torch.Tensor, list[str]]:
    """Per-layer post-FFN gains (None where a block has no post-FFN norm), the final norm's gain,
    and the hook names of the scales to capture (post-FFN ones in layer order, then the final one)."""
    if not str(getattr(model.cfg, "normalization_type", "")).startswith("RMS"):
        raise ValueError(f"norms='fold' needs an RMSNorm model; this one uses {model.cfg.normalization_type!r}")
    split = [l for l in range(len(model.blocks)) if branched(model, l)]
    if split:
        raise UnsupportedFamily(
            f"norms='fold': layers {split} normalize their experts' sum and their dense MLP's output apart "
            "before adding them (Gemma 4), which one frozen post-FFN scale per layer does not fold; use norms='raw'"
        )
    from capinterp.arch.layer_extras import layer_extras

    if streams := [text for kind, text in layer_extras(model).items() if kind in ("streams", "altup")]:
        fam = family_of(model)
        raise UnsupportedFamily(
            f"norms='fold' on {fam.name} ({fam.architecture}): this model {'; '.join(streams)}, so a neuron's path "
            "to the logits is no chain of norms whose frozen scales fold; use norms='raw'"
        )
    d = model.cfg.d_model
    post = [rms_gain(b.ln2_post, d) if hasattr(b, "ln2_post") else None for b in model.blocks]
    names = [f"blocks.{l}.ln2_post.hook_scale" for l, g in enumerate(post) if g is not None] + ["ln_final.hook_scale"]
    return post, rms_gain(model.ln_final, d), names


def fold_for(model: Model, norms: str) -> tuple | None:
    """Check ``norms`` (one of :data:`NORMS`); :func:`folded_norms` for ``"fold"``, None for ``"raw"``."""
    if norms not in NORMS:
        raise ValueError(f"norms must be one of {', '.join(NORMS)}, got {norms!r}")
    return folded_norms(model) if norms == "fold" else None


def unembed_columns(model: Model, token_ids: Int[Tensor, " n"]) -> Float[Tensor, "d_model n"]:
    """``W_U[:, token_ids]``: the scored tokens' columns, read once and shared by every layer."""
    with weights_readable(model.unembed):
        w_u = model.W_U
        return w_u[:, token_ids.to(w_u.device)]


def projection(model: Model, layer: int, w_u: Float[Tensor, "d_model n"]) -> Float[Tensor, "d_mlp n"]:
    """``W_out[layer] @ w_u`` -> ``[d_mlp, n]``, with ``w_u`` from :func:`unembed_columns`."""
    with weights_readable(model.blocks[layer].mlp):
        w_out = down_projection(model, layer).values().to(w_u.device)  # [d_mlp, d_model], raw weights
        return (w_out @ w_u).float()


def layer_scales(model: Model) -> list[float]:
    """Per layer, the product of the scales the residual stream takes from that layer's end to the
    final norm (Gemma 4's ``layer_scalar``, which multiplies the whole residual after each layer, the
    layer's own MLP output included); 1 where the model has none."""
    from capinterp.arch.layer_extras import layer_scalars

    own = layer_scalars(model)
    out, acc = [0.0] * len(own), 1.0
    for l in reversed(range(len(own))):
        acc *= own[l]
        out[l] = acc
    return out


def direct_gain(model: Model) -> float:
    """The linear factors between a neuron's down-projection output and the logits that the
    weights do not hold: the family's residual multiplier (Granite scales every MLP output
    before it joins the residual), its FFN output multiplier (Falcon-H1's down multiplier) and its
    logit multiplier (Cohere's logit_scale, Granite's 1 / logits_scaling, Falcon-H1's lm_head_multiplier). With them a DCSN score is the neuron's direct effect on the target
    logit (before a final soft-cap; Gemma 4's layer scales come on top, :func:`layer_scales`); the
    paper's ``W_out W_U`` (its DCSN definition) is silent on them, and for families without them the
    factor is 1. On DeepSeek-V4, whose residual is four streams mixed by input-dependent weights, no
    fixed factor makes it the direct effect: the score there is the paper's static one."""
    fam = family_of(model)
    return fam.residual_multiplier * fam.ffn_multiplier * fam.logit_multiplier


@torch.no_grad()
def per_sample_scores(
    model: Model, items: list[Encoded], target: str = "gold", fold: tuple | None = None
) -> tuple[Float[Tensor, "n n_layers d_mlp"], Int[Tensor, " n"], Int[Tensor, " n"]]:
    """Single-sample scores ``C_j`` ``[n, n_layers, d_mlp]``, the token ``t_j`` scored ``[n]``, and
    the greedy token at the last prompt position ``[n]``.

    ``target``: ``"gold"`` (first target token) or ``"pred"`` (argmax at the last prompt token);
    ``fold``: :func:`folded_norms` of the model, or None for the raw projection.
    """
    if fold is None:
        acts, logits = cast(tuple[Tensor, Tensor], last_token_activations(model, items))  # no extra: a pair
    else:  # fold[2] is never empty (it ends with ln_final.hook_scale): the triple
        acts, logits, scales = cast(tuple[Tensor, Tensor, dict], last_token_activations(model, items, tuple(fold[2])))
    if target == "gold":
        tok = torch.tensor([it.target_ids[0] for it in items], device=acts.device)
    else:
        tok = logits.argmax(-1)
    w_u = unembed_columns(model, tok)
    out = torch.empty_like(acts)
    gain, later = direct_gain(model), layer_scales(model)
    for l in range(acts.shape[1]):
        proj = projection(model, l, w_u).T if fold is None else folded_projection(model, l, w_u, fold, scales)
        out[:, l] = acts[:, l] * proj.to(acts.device) * (gain * later[l])
    return out, tok, logits.argmax(-1)


def folded_projection(
    model: Model, layer: int, w_u: Float[Tensor, "d_model n"], fold: tuple, scales: dict[str, Float[Tensor, "n 1"]]
) -> Float[Tensor, "n d_mlp"]:
    """``[n, d_mlp]``: each neuron's direct effect on the tokens of ``w_u`` (:func:`unembed_columns`)
    per unit activation, norms folded (scales frozen)."""
    post, g_final, _ = fold
    w_u = w_u.float()
    with weights_readable(model.blocks[layer].mlp):
        w = down_projection(model, layer).values().to(w_u.device).float() * g_final.to(w_u.device)  # [d_mlp, d_model]
    s = scales["ln_final.hook_scale"][:, 0].to(w_u.device)
    if post[layer] is not None:
        w = w * post[layer].to(w_u.device)
        s = s * scales[f"blocks.{layer}.ln2_post.hook_scale"][:, 0].to(w_u.device)
    return (w @ w_u).T / s[:, None]


@register("dcsn")
class DCSN(DatasetNeuronLocalizer):
    """Activation x unembedding-projection scores, averaged over a dataset.

    Args:
        sigma: mask threshold in standard deviations (the DCSN paper, anon. 2025, Table 12 peaks at 6).
        target: ``"gold"`` (first gold answer token) or ``"pred"`` (the model's argmax).
        norms: ``"raw"`` (the paper's ``W_out @ W_U``) or ``"fold"`` (fold the post-FFN and final
            RMSNorms into the projection, scales frozen per sample: the exact direct effect;
            recommended on Gemma 3, see the module docstring).
    """

    _parameter_constraints: ClassVar[dict[str, list[Any]]] = {
        "target": [Options("gold", "pred")],
        "norms": [Options(*NORMS)],
    }

    def __init__(
        self, model: Model, *, sigma: float = 6.0, target: str = "gold", norms: str = "raw", **kwargs: Any
    ) -> None:
        super().__init__(model, sigma=sigma, **kwargs)
        self.target = target
        self.norms = norms

    def _begin_fit(self) -> None:
        super()._begin_fit()
        self._fold = fold_for(self.model, self.norms)  # reads the norms' weights: fit's work

    def _chunk_size(self) -> int:
        return self.batch_size_

    def _count(self, work: Any, items: list, batch_size: int) -> None:
        """One forward per batch (unembedded at the last prompt token), then each layer's value
        vectors projected on the batch's target columns."""
        from capinterp.localizers.cost_counts import forward_work

        forward_work(work, "forward", [len(it.prompt_ids) for it in items], batch_size)
        sh = work.shape
        work.flops("projections", 2.0 * sh["n_layers"] * sh["d_mlp"] * sh["d_model"] * len(items))

    def _score_chunk(self, items: list[Encoded]) -> torch.Tensor:
        return per_sample_scores(self.model, items, self.target, self._fold)[0].cpu()
