"""Direct logit effects of neurons, heads and experts (capinterp/cards/logit_effect.py), each checked against
a hand computation from the state dict of a separate, plain transformers copy of the same tiny model."""

from __future__ import annotations

import pytest
import torch

import capinterp as ci
from capinterp.arch.family import UnsupportedFamily
from capinterp.arch.neuron_weights import value_rows
from capinterp.arch.tiny import tiny_hf
from capinterp.cards.logit_effect import expert_logit_effects, head_ov_effects, neuron_logit_effects

K = 6


def _draw_norms(hf) -> None:
    """Every 1-D parameter (the norms' weights) drawn away from its init, the same way on every copy."""
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for _, p in sorted(hf.named_parameters()):
            if p.dim() == 1:
                p.copy_(torch.rand(p.shape, generator=gen) + 0.5)


def _models(family: str, **overrides):
    """``(plain transformers copy's state dict, its config, the loaded model)``, norms drawn on both."""
    ref, _ = tiny_hf(family, **overrides)
    hf, tok = tiny_hf(family, **overrides)
    _draw_norms(ref)
    _draw_norms(hf)
    return {k: v.detach().float() for k, v in ref.state_dict().items()}, ref.config, ci.load_model(hf, tokenizer=tok)


def _assert_ranked(effect, want: torch.Tensor) -> None:
    top, bottom = torch.topk(want, K), torch.topk(-want, K)
    assert [t for _, t, _ in effect.promoted] == top.indices.tolist()
    assert [t for _, t, _ in effect.suppressed] == bottom.indices.tolist()
    assert torch.allclose(torch.tensor([v for *_, v in effect.promoted]), top.values, rtol=1e-4, atol=1e-6)
    assert torch.allclose(torch.tensor([v for *_, v in effect.suppressed]), -bottom.values, rtol=1e-4, atol=1e-6)


# per family: value vector of neuron (l, i), the fold of a direction written by layer l's FFN, W_U, multiplier
HAND = {
    "llama": (
        lambda sd, l, i: sd[f"model.layers.{l}.mlp.down_proj.weight"][:, i],
        lambda sd, v, l: v * sd["model.norm.weight"],
        lambda sd: sd["lm_head.weight"].T,
        lambda cfg: 1.0,
    ),
    "gpt2": (  # Conv1D c_proj [d_mlp, d_model]; final LayerNorm: centring and gain; tied embeddings
        lambda sd, l, i: sd[f"transformer.h.{l}.mlp.c_proj.weight"][i],
        lambda sd, v, l: (v - v.mean()) * sd["transformer.ln_f.weight"],
        lambda sd: sd["transformer.wte.weight"].T,
        lambda cfg: 1.0,
    ),
    "gemma3_text": (  # post-FFN norm, (1 + w) gains, tied embeddings, a soft-cap (reported before it)
        lambda sd, l, i: sd[f"model.layers.{l}.mlp.down_proj.weight"][:, i],
        lambda sd, v, l: (
            v * (1 + sd[f"model.layers.{l}.post_feedforward_layernorm.weight"]) * (1 + sd["model.norm.weight"])
        ),
        lambda sd: sd["model.embed_tokens.weight"].T,
        lambda cfg: 1.0,
    ),
    "granite": (  # residual multiplier on the MLP output, logits divided by logits_scaling
        lambda sd, l, i: sd[f"model.layers.{l}.mlp.down_proj.weight"][:, i],
        lambda sd, v, l: v * sd["model.norm.weight"],
        lambda sd: sd["lm_head.weight"].T,
        lambda cfg: cfg.residual_multiplier / cfg.logits_scaling,
    ),
}
OVERRIDES = {"gemma3_text": dict(final_logit_softcapping=0.1)}  # a cap the effects (~0.3) pass


@pytest.mark.parametrize("family", sorted(HAND))
def test_neuron_effects_equal_a_hand_computation_from_the_raw_weights(family):
    sd, cfg, model = _models(family, **OVERRIDES.get(family, {}))
    value, fold, w_u, mult = HAND[family]
    neurons = [(1, 3), (0, 17), (1, 95)]
    for norms in ("fold", "raw"):
        got = neuron_logit_effects(model, neurons, k=K, norms=norms)
        assert [e.unit for e in got] == neurons
        for (l, i), e in zip(neurons, got):
            v = value(sd, l, i)
            _assert_ranked(e, (fold(sd, v, l) if norms == "fold" else v) @ w_u(sd) * mult(cfg))
            assert e.definition.startswith(norms)
    if family in OVERRIDES:
        assert "soft-cap" in got[0].definition  # the values checked above are the pre-cap ones
        assert max(v for e in got for *_, v in e.promoted) > 0.1
    assert neuron_logit_effects(model, neurons, k=K)[0] != neuron_logit_effects(model, neurons, k=K, norms="raw")[0]


def test_a_planted_unembedding_direction_is_promoted_first():
    hf, tok = tiny_hf("llama")
    model = ci.load_model(hf, tokenizer=tok)
    token = tok.convert_tokens_to_ids("7")
    with torch.no_grad():
        hf.lm_head.weight[token] *= 3.0  # a distinct unembedding direction
        value_rows(model, 1)[42] = hf.lm_head.weight[token]
        value_rows(model, 0)[5] = -hf.lm_head.weight[token]
    up, down = neuron_logit_effects(model, [(1, 42), (0, 5)], k=3)
    assert up.promoted[0][:2] == ("7", token)
    assert down.suppressed[0][:2] == ("7", token)
    assert up.promoted[0][2] > 2 * up.promoted[1][2]


def _ov_hand(family: str, sd, cfg, l: int, h: int, norms: str) -> torch.Tensor:
    """``[d_vocab, d_vocab]``: source s's logit effect through head (l, h), by hand."""
    if family == "llama":  # 4 heads, 2 key/value heads: head h reads value group h // 2
        dh, g = cfg.head_dim, h // (cfg.num_attention_heads // cfg.num_key_value_heads)
        w_v = sd[f"model.layers.{l}.self_attn.v_proj.weight"][g * dh : (g + 1) * dh]  # [d_head, d_model]
        w_o = sd[f"model.layers.{l}.self_attn.o_proj.weight"][:, h * dh : (h + 1) * dh]  # [d_model, d_head]
        x, ln1 = sd["model.embed_tokens.weight"], sd[f"model.layers.{l}.input_layernorm.weight"]
        if norms == "fold":
            x = x / x.pow(2).mean(-1, keepdim=True).sqrt() * ln1
        out = x @ w_v.T @ w_o.T
        out = out * sd["model.norm.weight"] if norms == "fold" else out
        return out @ sd["lm_head.weight"].T
    d, dh = 32, 8  # gpt2: Conv1D c_attn [d_model, 3 d_model] (q, k, v), c_proj [d_model (in), d_model]
    w_v = sd[f"transformer.h.{l}.attn.c_attn.weight"][:, 2 * d + h * dh : 2 * d + (h + 1) * dh]
    w_o = sd[f"transformer.h.{l}.attn.c_proj.weight"][h * dh : (h + 1) * dh]
    x = sd["transformer.wte.weight"]
    if norms == "fold":
        x = x - x.mean(-1, keepdim=True)
        x = x / x.pow(2).mean(-1, keepdim=True).sqrt() * sd[f"transformer.h.{l}.ln_1.weight"]
    out = x @ w_v @ w_o
    if norms == "fold":
        out = (out - out.mean(-1, keepdim=True)) * sd["transformer.ln_f.weight"]
    return out @ sd["transformer.wte.weight"].T


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_head_ov_effects_equal_a_hand_computation(family):
    sd, cfg, model = _models(family)
    heads, sources = [(1, 3), (0, 1)], [5, 77, 300]
    for norms in ("fold", "raw"):
        full = {u: _ov_hand(family, sd, cfg, *u, norms) for u in heads}
        for e, u in zip(head_ov_effects(model, heads, k=K, sources=sources, norms=norms), heads):
            assert e.unit == ("head", *u) and [t for _, t in e.sources] == sources
            _assert_ranked(e, full[u][sources].mean(0))
        for e, u in zip(head_ov_effects(model, heads, k=K, norms=norms), heads):  # default: the strongest source
            c = full[u] - full[u].mean(-1, keepdim=True)
            best = int(c.norm(dim=-1).argmax())
            assert [t for _, t in e.sources] == [best]
            _assert_ranked(e, full[u][best])
    one = head_ov_effects(model, [("head", 1, 3)], k=K, sources={(1, 3): [9]})[0]
    assert [t for _, t in one.sources] == [9]


@pytest.mark.parametrize("family", ["mixtral", "qwen2_moe"])
def test_expert_effects_equal_a_hand_computation(family):
    sd, _, model = _models(family)
    experts = [(1, 2), (0, 3)]
    w = torch.linspace(-1.0, 2.0, 48)
    for norms in ("fold", "raw"):
        got = expert_logit_effects(model, experts, k=K, norms=norms)
        weighted = expert_logit_effects(model, experts, k=K, norms=norms, weights={(1, 2): w})
        for (l, e), eff, weff in zip(experts, got, weighted):
            rows = sd[f"model.layers.{l}.mlp.experts.down_proj"][e].T  # [d_expert, d_model]
            gain = sd["model.norm.weight"] if norms == "fold" else 1.0
            assert eff.unit == ("expert", l, e)
            _assert_ranked(eff, (rows.sum(0) * gain) @ sd["lm_head.weight"].T)
            rw = rows * w[:, None] if (l, e) == (1, 2) else rows
            _assert_ranked(weff, (rw.sum(0) * gain) @ sd["lm_head.weight"].T)


def test_bad_units_are_refused_clearly():
    hf, tok = tiny_hf("llama")
    llama = ci.load_model(hf, tokenizer=tok)
    with pytest.raises(ValueError, match="not one of this model's neurons"):
        neuron_logit_effects(llama, [(2, 0)])
    with pytest.raises(ValueError, match="not one of this model's neurons"):
        neuron_logit_effects(llama, [(0, 96)])
    with pytest.raises(ValueError, match="pairs"):
        neuron_logit_effects(llama, [3])
    with pytest.raises(ValueError, match="norms"):
        neuron_logit_effects(llama, [(0, 1)], norms="folded")
    with pytest.raises(ValueError, match="k must be"):
        neuron_logit_effects(llama, [(0, 1)], k=0)
    with pytest.raises(ValueError, match="heads"):
        head_ov_effects(llama, [(0, 4)])
    with pytest.raises(ValueError, match="token ids"):
        head_ov_effects(llama, [(0, 1)], sources=[10_000])
    with pytest.raises(ValueError, match="dense model"):
        expert_logit_effects(llama, [(0, 0)])
    hf, tok = tiny_hf("mixtral")
    with pytest.raises(ValueError, match="outside layer 1's 4 routed experts"):
        expert_logit_effects(ci.load_model(hf, tokenizer=tok), [(1, 4)])
    hf, tok = tiny_hf("lfm2")  # a hybrid: convolution mixers beside attention
    with pytest.raises(UnsupportedFamily, match="softmax attention"):
        head_ov_effects(ci.load_model(hf, tokenizer=tok), [(1, 0)])
