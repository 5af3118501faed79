"""Neuron localizers (KN, CNL, SIG, AMIG, DCSN, NeFT, Query Localization) and IG's fast route,
each against a reference written on the plain transformers model (:mod:`._hf_ig`).

IG-based scores must match the hand-written IG of p(target) with respect to each layer's
down-projection input to 1e-4 of the layer's largest score (float64 reference; the quadrature
is the "right" rule, alpha_k = k/m, weight 1/m, written out here). DCSN's score of neuron
(l, i) is its direct effect on the target logit through the raw weights: activation x
(down-projection row . unembedding column) x the family's residual multiplier x its logit
multiplier (the DCSN paper's definition names no multipliers; see capinterp.localizers.dcsn).
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from capinterp.arch.family import family_of
from capinterp.core.protocol import Model
from capinterp.testing.contract import require
from capinterp.testing.family_checks._hf import decoder_layers
from capinterp.testing.family_checks._hf_ig import (
    clean_down_inputs,
    down_weight,
    ig_reference,
    layer_width,
    neuron_weight_change,
)
from capinterp.testing.family_checks._models import PROMPTS, load_pair, plain_hf

__all__ = ["CHECKS"]

STEPS = 6
NEFT_LR = 0.1
REL = 1e-4


def _right(m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The "right" Riemann rule written out: alpha_k = k/m (k = 1..m), weight 1/m."""
    return torch.arange(1, m + 1, dtype=torch.float64) / m, torch.full((m,), 1.0 / m, dtype=torch.float64)


def _data(model: Model) -> tuple[list, list]:
    from capinterp.core.example import Example
    from capinterp.core.tokens import encode

    examples = [Example(prompt=p, target=" Paris") for p in PROMPTS]
    return examples, encode(model, examples)


def _ids(item: Any) -> tuple[torch.Tensor, int]:
    return torch.tensor([item.prompt_ids]), int(item.target_ids[0])


def _close(got: torch.Tensor, want: torch.Tensor, what: str, hf: Any, rel: float = REL) -> None:
    """Per layer: max |got - want| <= rel * the layer's largest |want| (floor 1e-12); past a dense
    layer's own neurons (read from ``hf``, a model mixing dense and MoE layers), exactly 0."""
    for l in range(want.shape[0]):
        pad = got[l, layer_width(hf, l, want.shape[1]) :]
        require(
            not bool(pad.any()),
            lambda: f"{what}: layer {l}: padding neurons scored {float(pad.abs().max()):.3g}, not 0",
        )
        err = (got[l].double() - want[l]).abs().max().item()
        scale = max(want[l].abs().max().item(), 1e-12)
        require(err <= rel * scale, lambda: f"{what}: layer {l} off by {err:.3g} (largest score {scale:.3g})")


def _ig_ref(hf: Any, item: Any, d_mlp: int, *, pos: int | None = None, baseline=None) -> torch.Tensor:
    """[n_layers, d_mlp]: hand IG of every layer at ``pos`` (default: the last prompt token); 0
    past a dense layer's own neurons on a model mixing dense and MoE layers (padding is no neuron)."""
    ids, target = _ids(item)
    alphas, weights = _right(STEPS)
    pos = ids.shape[1] - 1 if pos is None else pos
    n = len(clean_down_inputs(hf, ids, d_mlp))
    out = torch.zeros(n, d_mlp, dtype=torch.float64)
    for l in range(n):
        s = ig_reference(hf, ids, target, l, pos, alphas, weights, d_mlp, None if baseline is None else baseline[l])[0]
        out[l, : s.shape[0]] = s
    return out


def _ig_kwargs() -> dict:
    return dict(steps=STEPS, rule="right", invariance="off", progress=False)


def check_ig_fast_route(family: str) -> None:
    """``ig_scores`` with ``route="fast"`` runs the staircase route (no fallback) and equals the hand IG."""
    from capinterp.kernels import ig as _ig
    from capinterp.kernels.ig import ig_scores
    from capinterp.kernels.ig_config import IGConfig

    _, _, model = load_pair(family)
    hf = plain_hf(family)
    _, items = _data(model)
    d_mlp = family_of(model).d_mlp
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = ig_scores(
            model, items, IGConfig(steps=STEPS, rule="right", positions="last_prompt", route="fast", invariance="off")
        )
    routes = [str(w.message) for w in caught if "route" in str(w.message) or "KV cache" in str(w.message)]
    for j, item in enumerate(items):
        _close(got[j], _ig_ref(hf, item, d_mlp), f"{family} fast IG, prompt {j}", hf)
    require(not routes, lambda: f"{family}: the fast route fell back: {routes[0]}")
    require(all(_ig._STAIR_OK.get(model, {}).values()), lambda: f"{family}: stair check failed")


def check_kn(family: str) -> None:
    """KN's per-prompt scores equal the hand IG of p(target) at the last prompt token, every layer."""
    from capinterp.localizers.kn import KN

    _, _, model = load_pair(family)
    hf = plain_hf(family)
    examples, items = _data(model)
    kn = KN(model, refine=False, **_ig_kwargs()).fit(examples)
    d_mlp = family_of(model).d_mlp
    for j, item in enumerate(items):
        _close(kn.prompt_scores_[j], _ig_ref(hf, item, d_mlp), f"{family} KN, prompt {j}", hf)


def check_cnl(family: str) -> None:
    """CNL's dataset score is the mean over examples of the hand IG (single-token answers)."""
    from capinterp.localizers.cnl import CNL

    _, _, model = load_pair(family)
    hf = plain_hf(family)
    examples, items = _data(model)
    cnl = CNL(model, positions="last_prompt", sigma=1.0, **_ig_kwargs()).fit(examples)
    d_mlp = family_of(model).d_mlp
    want = torch.stack([_ig_ref(hf, it, d_mlp) for it in items]).mean(0)
    _close(cnl.scores_.scores, want, f"{family} CNL", hf)


def check_sig(family: str) -> None:
    """SIG: the sum over prompt positions (BOS excluded) of the hand IG scaling that position alone."""
    from capinterp.localizers.sig import SIG

    _, _, model = load_pair(family)
    hf = plain_hf(family)
    examples, items = _data(model)
    sig = SIG(model, refine=False, **_ig_kwargs()).fit(examples)
    d_mlp = family_of(model).d_mlp
    bos = getattr(model.tokenizer, "bos_token_id", None)
    for j, item in enumerate(items):
        ids = item.prompt_ids
        first = 1 if len(ids) > 1 and ids[0] == bos else 0
        want = sum(_ig_ref(hf, item, d_mlp, pos=p) for p in range(first, len(ids)))
        assert isinstance(want, torch.Tensor)
        _close(sig.prompt_scores_[j], want, f"{family} SIG, prompt {j}", hf)


def check_amig(family: str) -> None:
    """AMIG from a given baseline b: the hand IG along ``b + alpha (a - b)`` at the last prompt token."""
    from capinterp.localizers.amig import AMIG

    _, _, model = load_pair(family)
    hf = plain_hf(family)
    examples, items = _data(model)
    n_layers, d_mlp = family_of(model).neurons
    baseline = torch.rand(n_layers, d_mlp, generator=torch.Generator().manual_seed(0)) * 0.1
    amig = AMIG(model, baseline=baseline, refine=False, **_ig_kwargs()).fit(examples)
    for j, item in enumerate(items):
        want = _ig_ref(hf, item, d_mlp, baseline=baseline)
        _close(amig.prompt_scores_[j], want, f"{family} AMIG, prompt {j}", hf)


def check_dcsn(family: str) -> None:
    """DCSN: mean_j a_j(l, i) (last prompt token) x (W_down[l] row i . W_U[t_j]) x the family's
    residual and logit multipliers, from the transformers weights."""
    from capinterp.localizers.dcsn import DCSN

    _, _, model = load_pair(family)
    hf = plain_hf(family)
    examples, items = _data(model)
    fam = family_of(model)
    got = DCSN(model, sigma=1.0, progress=False).fit(examples).scores_.scores
    w_u = hf.get_output_embeddings().weight.detach().double()  # [V, d_model]
    cfg = hf.config.get_text_config()
    mult = float(getattr(cfg, "residual_multiplier", None) or 1.0) * float(getattr(cfg, "logit_scale", None) or 1.0)
    if getattr(cfg, "logits_scaling", None):
        mult /= float(cfg.logits_scaling)
    want = torch.zeros(fam.n_layers, fam.d_mlp, dtype=torch.float64)
    # Gemma 4 scales the whole residual after each layer: a neuron's direct path takes its own layer's
    # scale and every later one's
    scalars = [float(getattr(layer, "layer_scalar", torch.ones(1)).double().prod()) for layer in decoder_layers(hf)]
    for item in items:
        ids, t = _ids(item)
        acts = clean_down_inputs(hf, ids, fam.d_mlp)
        for l in range(fam.n_layers):
            proj = down_weight(hf, l, fam.d_mlp).double() @ w_u[t]  # [the layer's own neurons]
            later = float(torch.tensor(scalars[l:], dtype=torch.float64).prod())
            want[l, : proj.shape[0]] += acts[l][-1].double() * proj * mult * later / len(items)
    _close(got, want, f"{family} DCSN", hf, rel=1e-5)


def check_neft(family: str) -> None:
    """NeFT on a fresh copy: it runs, selects top_k neurons, scores >= 0, restores every weight
    exactly (compared with a copy of the transformers state dict taken before), and its scores
    and selection equal 1 - cos of each neuron's FFN weights after one SGD step taken by hand on a
    copy of the plain transformers model (:func:`._hf_ig.neuron_weight_change`), to 1e-3."""
    from capinterp.arch.model import load_model
    from capinterp.arch.tiny import tiny_hf
    from capinterp.localizers.neft import NeFT

    hf, tok = tiny_hf(family)
    model = load_model(hf, tokenizer=tok)
    examples, items = _data(model)
    before = {k: v.detach().clone() for k, v in hf.state_dict().items()}
    neft = NeFT(model, steps=1, lr=NEFT_LR, top_k=5, batch_size=len(items), progress=False).fit(examples)
    after = hf.state_dict()
    changed = [k for k, v in before.items() if not torch.equal(v, after[k])]
    require(not changed, lambda: f"{family}: NeFT left weights changed: {changed[:3]}")
    s = neft.scores_.scores
    require(
        s.shape == family_of(model).neurons and torch.isfinite(s).all() and (s >= -1e-12).all(),
        "failed: s.shape == family_of(model).neurons and torch.isfinite(s).all() and (s >= -1e-12).all()",
    )
    require(
        int(neft.neurons_.mask.sum()) == 5,
        lambda: f"{family}: NeFT selected {int(neft.neurons_.mask.sum())} neurons, not 5",
    )
    require(float(s.max()) > 0, lambda: f"{family}: NeFT moved no neuron")
    ref = plain_hf(family)
    want = neuron_weight_change(ref, [(it.prompt_ids, it.target_ids) for it in items], NEFT_LR, family_of(model).d_mlp)
    _close(s, want, f"{family} NeFT 1 - cos", ref, rel=1e-3)
    top = set(want.flatten().topk(5).indices.tolist())
    require(set(neft.neurons_.mask.flatten().nonzero()[:, 0].tolist()) == top, lambda: f"{family}: NeFT's top 5 differ")


def check_query_localization(family: str) -> None:
    """Query Localization over a bag of paraphrases with KN: every query's map is the hand IG."""
    from capinterp.localizers.query_localization import QueryLocalization

    _, _, model = load_pair(family)
    hf = plain_hf(family)
    examples, items = _data(model)
    ql = QueryLocalization(model, "kn", steps=STEPS, rule="right", invariance="off", refine=False, progress=False).fit(
        [examples]
    )
    d_mlp = family_of(model).d_mlp
    require(
        len(ql.query_scores_) == 1 and ql.query_scores_[0].shape[0] == len(items),
        "failed: len(ql.query_scores_) == 1 and ql.query_scores_[0].shape[0] == len(items)",
    )
    for j, item in enumerate(items):
        _close(ql.query_scores_[0][j], _ig_ref(hf, item, d_mlp), f"{family} QL query {j}", hf)
    require(len(ql.consistency_) == 1, "failed: len(ql.consistency_) == 1")


CHECKS = {
    "kn": check_kn,
    "cnl": check_cnl,
    "sig": check_sig,
    "amig": check_amig,
    "dcsn": check_dcsn,
    "neft": check_neft,
    "query_localization": check_query_localization,
    "ig_fast_route": check_ig_fast_route,
}
