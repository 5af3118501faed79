"""JetMoE (issue 27): experts kept as two ParallelExperts modules, a router that returns its choices
grouped by expert, a bias on the MoE block's output, and attention whose heads are experts routed per
token. Checked against plain transformers with non-zero biases (transformers initializes them to 0)."""

from __future__ import annotations

import copy
import functools
import warnings

import pytest
import torch

import capinterp as ci
from capinterp.arch import experts as EX
from capinterp.arch.family import UnsupportedFamily
from capinterp.arch.tiny import tiny_hf
from capinterp.data import Example

PROMPT = "The Eiffel Tower is in the city of"


def _biased(seed: int = 0):
    """A tiny JetMoE whose MoE and attention output biases are drawn (not 0), and an untouched copy."""
    hf, tok = tiny_hf("jetmoe", seed=seed)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith(("mlp.bias", "experts.bias")):
                p.copy_(0.3 * torch.randn(p.shape, generator=gen))
    return hf, copy.deepcopy(hf), tok


@functools.cache
def _pair():
    hf, plain, tok = _biased()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ci.load_model(hf, tokenizer=tok), plain, tok


@torch.no_grad()
def test_logits_match_transformers_with_biases():
    model, plain, tok = _pair()
    assert all(float(layer.mlp.bias.abs().max()) > 0.1 for layer in plain.model.layers)
    ids = tok(PROMPT, return_tensors="pt")["input_ids"]
    want = plain(ids).logits
    assert float((model(ids) - want).abs().max()) <= 1e-5 * float(want.abs().max())
    fam = ci.family_of(model)
    assert (fam.moe.n_experts, fam.moe.d_expert, fam.moe.top_k, fam.d_mlp) == (4, 48, 2, 192)
    assert fam.routed_heads and not ci.family_of(ci.load_model(tiny_hf("mixtral")[0], tokenizer=tok)).routed_heads


@torch.no_grad()
def test_neurons_are_router_weighted_expert_activations():
    """a[e, i] = w_e(x) * silu(gate_e(x))[i] * up_e(x)[i] on the top-k experts of the router's logits
    (a softmax over those k), 0 elsewhere: written out from the transformers modules."""
    model, plain, tok = _pair()
    ids = tok(PROMPT, return_tensors="pt")["input_ids"]
    block = plain.model.layers[1].mlp
    seen = {}
    block.register_forward_pre_hook(lambda _m, a: seen.update(x=a[0].reshape(-1, a[0].shape[-1])))
    plain(ids)
    x = seen["x"]
    top_v, top_i = block.router.layer(x).float().topk(2, dim=-1)
    weights = torch.zeros(x.shape[0], 4).scatter(1, top_i, torch.softmax(top_v, -1))
    want = []
    for e in range(4):
        gate, up = (x @ block.input_linear.weight[e].T).chunk(2, dim=-1)
        want.append(weights[:, e : e + 1] * torch.nn.functional.silu(gate) * up)
    _, cache = model.run_with_cache(ids, names_filter="blocks.1.mlp.hook_post")
    got = cache["blocks.1.mlp.hook_post"][0]
    assert torch.allclose(got, torch.cat(want, dim=-1), atol=1e-6, rtol=1e-5)
    assert int((got != 0).sum()) == 2 * 48 * x.shape[0]  # exactly the two chosen experts' neurons


def test_grouped_routing_unpacks_the_routers_choices():
    """JetMoE's router returns rows grouped by expert; per token they are the top-k of its logits."""
    hf, _, _ = _biased()
    router = hf.model.layers[0].mlp.router
    x = torch.randn(9, 32, generator=torch.Generator().manual_seed(1))
    weights, index = EX._grouped_routing(router(x), 9, 2)
    top_v, top_i = router.layer(x).float().topk(2, dim=-1)
    assert torch.equal(index, top_i)
    assert torch.allclose(weights, torch.softmax(top_v, -1), atol=1e-7)


def test_a_forgotten_output_bias_is_refused_at_load(monkeypatch):
    """The load check runs the block both ways: without its output bias capinterp's forward differs."""
    real = EX._read_block

    def without_bias(*args):
        spec = real(*args)
        return EX._checked("jetmoe, layer 0", EX.replace(spec, out_bias=None), spec.experts.down_proj)

    monkeypatch.setattr(EX, "_read_block", without_bias)
    hf, _, tok = _biased()
    with pytest.raises(UnsupportedFamily, match="not the router-weighted sum.*differs by"):
        ci.load_model(hf, tokenizer=tok)


def test_erase_and_weights_reach_the_parallel_experts():
    """Erasing an expert = zeroing its output_linear slice in transformers; value vectors are
    output_linear's columns, and writing them writes the model's own weight."""
    model, plain, tok = _pair()
    ids = tok(PROMPT, return_tensors="pt")["input_ids"]
    from capinterp.arch.weights import down_projection
    from capinterp.units.base import KeySet

    values = down_projection(model, 1).values()
    w = plain.model.layers[1].mlp.output_linear.weight  # [E, d_model, d]
    assert torch.equal(values, w.transpose(1, 2).reshape(-1, 32))
    copy_ = copy.deepcopy(plain)
    with torch.no_grad():
        with ci.erase(model, KeySet([(1, 2), (0, 1)], "expert")):
            got = model(ids)[0, -1]
        copy_.model.layers[1].mlp.output_linear.weight[2] = 0.0
        copy_.model.layers[0].mlp.output_linear.weight[1] = 0.0
        want = copy_(ids).logits[0, -1]
    assert (got - want).abs().max() < 1e-5 * want.abs().max()


@pytest.mark.parametrize(
    "run",
    [
        lambda m: ci.localizers.get("knowledge_circuit")(m, algorithm="eap", progress=False).fit(
            [Example(PROMPT, " Paris")]
        ),
        lambda m: ci.circuits.head_patching.head_effects(m, [Example(PROMPT, " Paris")]),
    ],
    ids=["knowledge_circuit", "head_patching"],
)
def test_methods_over_heads_refuse_routed_heads(run):
    model, _, _ = _pair()
    with pytest.raises(UnsupportedFamily, match="^jetmoe .*heads are experts its router picks per token"):
        run(model)


def test_attention_tracing_runs_on_routed_heads():
    """Causal tracing of attention outputs needs the attention's output only, not heads: it runs."""
    model, _, _ = _pair()
    fact = Example(PROMPT, " Paris", meta={"subject": "Eiffel Tower"})
    trace = ci.localizers.get("causal_trace")(
        model, kinds=("attn",), samples=2, top_k=1, require_correct=False, progress=False
    ).fit([fact])
    assert torch.isfinite(torch.as_tensor(trace.per_prompt_[0]["grids"]["attn"])).all()
