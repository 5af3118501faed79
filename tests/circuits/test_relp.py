"""RelP per head against a hand-written reference on the plain transformers model: the same LRP rules
written by hand on the HF Llama modules (monkeypatched RMSNorm / MLP / eager attention, a
torch.autograd.Function for the gated product), the gradient taken at each o_proj input."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch.nn import functional as F

import capinterp as ci
from capinterp.arch.tiny import tiny_hf
from capinterp.circuits.head_patching import head_atp
from capinterp.circuits.relp import RELP_RULES, head_relp, relp_rules
from capinterp.core.tokens import encode
from capinterp.data import Example

EXAMPLES = [Example(f"{a}+{b}=", "7") for a, b in [(3, 4), (5, 2), (1, 6), (2, 9)]]


@pytest.fixture(scope="module")
def pair():
    """(plain HF Llama with eager attention, the bridge over an identical copy)."""
    hf, tok = tiny_hf("llama", seed=3)
    plain = copy.deepcopy(hf)
    plain.config._attn_implementation = "eager"
    plain.eval()
    return plain, ci.load_model(hf, tokenizer=tok)


class _HalfProduct(torch.autograd.Function):
    """``silu(g) * u`` whose backward is the identity rule on silu and the half rule on the product."""

    @staticmethod
    def forward(ctx, g, u):
        a = F.silu(g)
        ctx.save_for_backward(g, u, a)
        return a * u

    @staticmethod
    def backward(ctx, grad):
        g, u, a = ctx.saved_tensors
        ratio = torch.where(g == 0, torch.zeros_like(g), a / torch.where(g == 0, torch.ones_like(g), g))
        return grad * 0.5 * u * ratio, grad * 0.5 * a


def _patch_rules(monkeypatch, rules):
    from transformers.models.llama import modeling_llama as M

    calls = {"attn": 0}
    if "ln" in rules:

        def norm(self, x):
            xf = x.float()
            inv = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.variance_epsilon).detach()
            return self.weight * (xf * inv).to(x.dtype)

        monkeypatch.setattr(M.LlamaRMSNorm, "forward", norm)
    if "act" in rules:
        monkeypatch.setattr(
            M.LlamaMLP,
            "forward",
            lambda self, x: self.down_proj(_HalfProduct.apply(self.gate_proj(x), self.up_proj(x))),
        )

    def eager(module, query, key, value, attention_mask, scaling, dropout=0.0, **kw):
        calls["attn"] += 1
        key, value = M.repeat_kv(key, module.num_key_value_groups), M.repeat_kv(value, module.num_key_value_groups)
        w = query @ key.transpose(2, 3) * scaling
        if attention_mask is not None:
            w = w + attention_mask
        w = w.float().softmax(-1).to(query.dtype)
        if "attn" in rules:
            w = w.detach()
        return (w @ value).transpose(1, 2).contiguous(), w

    monkeypatch.setattr(M, "eager_attention_forward", eager)
    return calls


def _reference(plain, items, ablation_means=None):
    """Per head ``sum_t z_h . dm/dz_h`` at o_proj's input on the plain (patched) model, mean over items."""
    L = plain.config.num_hidden_layers
    H = plain.config.num_attention_heads
    dh = plain.model.layers[0].self_attn.head_dim
    out = torch.zeros(L, H, dtype=torch.float64)
    for it in items:
        zs, eps = {}, [torch.zeros(len(it.prompt_ids), H * dh, requires_grad=True) for _ in range(L)]

        def grab(l):
            def fn(mod, args):
                zs[l] = args[0].detach()
                return (args[0] + eps[l],)

            return fn

        handles = [plain.model.layers[l].self_attn.o_proj.register_forward_pre_hook(grab(l)) for l in range(L)]
        try:
            p = plain(torch.tensor([it.prompt_ids])).logits[0, -1].float().softmax(-1)[it.target_ids[0]]
        finally:
            for h in handles:
                h.remove()
        grads = torch.autograd.grad(p, eps)
        for l in range(L):
            out[l] += (zs[l][0] * grads[l]).reshape(-1, H, dh).sum((0, 2)).double()
    return (out / len(items)).numpy()


@pytest.mark.parametrize("rules", [RELP_RULES, ("ln",), ("attn",), ("act", "half")])
def test_relp_equals_hand_written_rules_on_plain_llama(pair, monkeypatch, rules):
    plain, m = pair
    assert plain.config.hidden_act == "silu"
    items = encode(m, EXAMPLES)
    calls = _patch_rules(monkeypatch, rules)
    expected = _reference(plain, items)
    assert calls["attn"] == len(items) * plain.config.num_hidden_layers  # the patched attention ran
    monkeypatch.undo()
    got = head_relp(m, EXAMPLES, rules=rules)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-9)
    # the rules change the estimate: it is not AtP's
    atp = head_atp(m, EXAMPLES)
    assert np.abs(expected).max() > 1e-5 and not np.allclose(got, atp, rtol=1e-2, atol=1e-7)


def test_relp_rules_keep_the_forward_values(pair):
    _, m = pair
    toks = m.to_tokens("The capital of France is the city of Paris")
    with torch.no_grad():
        before = m(toks)
    with torch.enable_grad(), relp_rules(m):
        during = m(toks).detach()
    assert torch.equal(before, during)
    with torch.no_grad():
        assert torch.equal(before, m(toks))  # and every hook is gone after


@pytest.mark.parametrize("family", ["gemma3_text", "gpt2", "olmo"])
def test_relp_rules_keep_forward_values_on_other_families(family):
    hf, tok = tiny_hf(family)
    m = ci.load_model(hf, tokenizer=tok)
    toks = m.to_tokens("The capital of France is")
    with torch.no_grad():
        before = m(toks)
    with torch.enable_grad(), relp_rules(m):
        during = m(toks).detach()
    torch.testing.assert_close(during, before, rtol=0, atol=0)
    r = head_relp(m, EXAMPLES)
    assert np.isfinite(r).all() and not np.allclose(r, head_atp(m, EXAMPLES), rtol=1e-2, atol=1e-7)


def test_rules_off_is_atp(pair):
    _, m = pair
    np.testing.assert_array_equal(head_relp(m, EXAMPLES, rules=()), head_atp(m, EXAMPLES))
    np.testing.assert_array_equal(
        head_relp(m, EXAMPLES, rules=(), ablation="mean"), head_atp(m, EXAMPLES, ablation="mean")
    )


def test_bad_rules_are_refused(pair):
    _, m = pair
    with pytest.raises(ValueError, match="unknown RelP rule"):
        head_relp(m, EXAMPLES, rules=("lrp",))
    with pytest.raises(ValueError, match="go together"):
        head_relp(m, EXAMPLES, rules=("half",))
