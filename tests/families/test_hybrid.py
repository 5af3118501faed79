"""Hybrid models (Qwen3-Next, Qwen3.5-MoE, OLMo-Hybrid: linear-attention layers beside softmax
attention; Bamba, Jamba: Mamba layers; Falcon-H1: attention and Mamba side by side; LFM2, LFM2-MoE:
short-convolution layers; Granite 4.0: Mamba-2 layers): served at load; neuron methods run (IG's fast route
continuing each row from a copy of the prefix's recurrent or convolution state); methods that need attention
(RelP's rules) refuse, naming why; knowledge circuits take each mixer as a graph node, head patching
the attention layers' heads."""

from __future__ import annotations

import copy
import functools
import re
import warnings

import numpy as np
import pytest
import torch

import capinterp as ci
from capinterp.arch.family import FFN_ONLY_LAYERS, UnsupportedFamily
from capinterp.arch.tiny import TINY_FAMILIES, TINY_HYBRID, model_type, tiny_hf

FAMILIES = tuple(TINY_HYBRID)
# the bridge runs these attention modules as transformers does, the pattern hook only observing: attention
# scaling is refused there (capinterp.arch.pattern_writes)
OBSERVE_ONLY = ("olmo_hybrid", "jamba", "nemotron_h", "nemotron_h_dense", "nemotron_h_latent")
FACTS = [
    ci.Example("The Eiffel Tower is in the city of", " Paris", meta={"subject": "The Eiffel Tower"}),
    ci.Example("Rome is the capital of", " Italy", meta={"subject": "Rome"}),
]


def _kinds(family: str) -> list[str]:
    """The tiny model's layer kinds (its transformers config's layer_types)."""
    from transformers import AutoConfig

    cfg = AutoConfig.for_model(model_type(family))
    for key, value in TINY_FAMILIES[family].items():
        setattr(cfg, key, value)
    return list(getattr(cfg, "layer_types", None) or ())


def _mixers(family: str) -> tuple[str, ...]:
    """The tiny model's layer kinds other than softmax attention."""
    return tuple(sorted({k for k in _kinds(family) if k == "linear_attention" or "attention" not in k}))


def test_hybrid_families_are_those_whose_layers_are_not_all_attention():
    assert {f for f in TINY_FAMILIES if _mixers(f)} == set(TINY_HYBRID)


@functools.cache
def _pair(family: str):
    hf, tok = tiny_hf(family)
    plain = copy.deepcopy(hf)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ci.load_model(hf, tokenizer=tok), plain, tok


@pytest.mark.parametrize("family", FAMILIES)
@torch.no_grad()
def test_loads_and_matches_transformers(family):
    model, plain, tok = _pair(family)
    assert ci.family_of(model).hybrid_layers == _mixers(family)
    ids = tok(FACTS[0].prompt, return_tensors="pt")["input_ids"]
    want = plain(ids).logits
    assert float((model(ids) - want).abs().max()) <= 1e-5 * float(want.abs().max())


#: the hybrids whose transformers continuation from a prefix's state is inexact past one token: Jamba's
#: Mamba scan of several tokens starts from a zero state (its torch scan takes no initial state)
INEXACT_PAST_ONE = ("jamba",)


def _no_fallback(run):
    """``run()``, asserting that no warning says IG left its fast route."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = run()
    said = [str(w.message) for w in caught if "route" in str(w.message) or "KV cache" in str(w.message)]
    assert not said, said
    return out


@pytest.mark.parametrize("family", FAMILIES)
def test_ig_fast_route_continues_the_mixer_state(family):
    """IG's fast route runs on a hybrid (no fallback, no warning), each row continuing from a copy of the
    prompt prefix's mixer state, and equals the loop route (every row the whole sequence): one scaled
    position (KN), and an answer of several tokens, where continuing Jamba's Mamba state is inexact and
    the loop route runs instead, said once with the reason; and the "prefix" route (the bridge's forward on
    a widened copy of the prefix's cache) likewise."""
    from capinterp.kernels.ig import ig_scores
    from capinterp.kernels.ig_config import IGConfig

    model = _pair(family)[0]
    fast = _no_fallback(lambda: ci.KN(model, progress=False).fit(FACTS).scores_.scores)
    loop = ci.KN(model, progress=False, route="loop").fit(FACTS).scores_.scores
    assert float(fast.abs().max()) > 0
    assert float((fast - loop).abs().max()) <= 1e-4 * float(loop.abs().max())
    from capinterp.core.tokens import encode

    enc = encode(model, [ci.Example("The Eiffel Tower is in the city of", " Paris, France")])
    assert len(enc[0].target_ids) >= 3
    cfg = IGConfig(steps=4, positions="answer")
    if family in INEXACT_PAST_ONE:
        with pytest.warns(
            RuntimeWarning, match="continuation of .*mixers' state.* over more than one token does not reproduce .*loop"
        ):
            fast = ig_scores(model, enc, cfg)
    else:
        fast = _no_fallback(lambda: ig_scores(model, enc, cfg))
    loop = ig_scores(model, enc, IGConfig(steps=4, positions="answer", route="loop"))
    assert float((fast - loop).abs().max()) <= 1e-4 * float(loop.abs().max())
    if family not in INEXACT_PAST_ONE:  # the bridge's own forward on the widened prefix cache, every row every layer
        prefix = _no_fallback(lambda: ig_scores(model, enc, cfg.replace(route="prefix")))
        assert float((prefix - loop).abs().max()) <= 1e-4 * float(loop.abs().max())


@pytest.mark.parametrize("family", ["bamba", "falcon_h1", "nemotron_h"])
def test_ig_fast_route_in_bfloat16(family):
    """In bfloat16 the continuation check and the staircase's self-check allow bfloat16's rounding, judged by
    the dtype the model computes in (NemotronH's logits come out in float32): the fast route runs, and agrees
    with the loop route to bfloat16's precision."""
    hf, tok = tiny_hf(family)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = ci.load_model(hf, tokenizer=tok, dtype="bfloat16")
    fast = _no_fallback(lambda: ci.KN(model, progress=False).fit(FACTS).scores_.scores)
    loop = ci.KN(model, progress=False, route="loop").fit(FACTS).scores_.scores
    assert float((fast - loop).abs().max()) <= 0.03 * float(loop.abs().max())


@pytest.mark.parametrize("family", FAMILIES)
def test_head_methods_take_the_attention_layers_and_relp_refuses_naming_the_mixer(family):
    """Head patching and AtP run on the attention layers' heads (NaN rows elsewhere; checked against
    transformers in tests/circuits/test_hybrid_heads.py); RelP has no rule for a mixer and refuses,
    naming the mixers; the attention view refuses a layer without attention."""
    model = _pair(family)[0]
    mixers = [k for k in _mixers(family) if k not in FFN_ONLY_LAYERS]  # NemotronH's FFN-only layers: named apart
    from capinterp.arch.model import attention_layers
    from capinterp.circuits.head_patching import head_atp
    from capinterp.circuits.relp import head_relp

    atp = head_atp(model, FACTS)
    att = attention_layers(model)
    assert not np.isnan(atp[att]).any() and np.isnan(np.delete(atp, att, axis=0)).all()
    with pytest.raises(UnsupportedFamily, match=rf"{model_type(family)}.*RelP.*{re.escape(str(mixers))} mixers"):
        head_relp(model, FACTS)
    from capinterp.plots.tokens import attention_pattern

    if _kinds(family)[0] == "hybrid":  # Falcon-H1: attention beside Mamba in every layer, its pattern is real
        assert attention_pattern(model, FACTS[0].prompt, 0)[1].shape[0] == model.cfg.n_heads
    else:
        with pytest.raises(UnsupportedFamily, match=rf"{model_type(family)}.*layer 0 has no softmax attention pattern"):
            attention_pattern(model, FACTS[0].prompt, 0)
    attends = next(l for l, k in enumerate(_kinds(family)) if k == "hybrid" or ("attention" in k and "linear" not in k))
    assert attention_pattern(model, FACTS[0].prompt, attends)[1].shape[0] == model.cfg.n_heads


@pytest.mark.parametrize("family", FAMILIES)
def test_attention_tracing_restores_the_attention_layers_only(family):
    """On a hybrid, kind "attn" restores the attention layers in each window: with window 1, a layer
    without attention restores nothing (its effect is 0, up to the rounding of another batch) and an
    attention layer's is not."""
    model = _pair(family)[0]
    trace = ci.localizers.get("causal_trace")(
        model, window=1, samples=2, top_k=1, require_correct=False, progress=False
    )  # two noise samples: a layer's restored effect is 0 or not whatever their number
    rec = trace.fit(FACTS[:1]).per_prompt_[0]
    attends = [getattr(b, "attn", None) is not None for b in model.blocks]
    assert any(attends) and set(rec["grids"]) == {"resid", "mlp", "attn"}
    grid = rec["grids"]["attn"]
    for layer, has in enumerate(attends):
        effect = float(grid[:, layer].abs().max())
        assert (effect > 1e-6) if has else (effect < 1e-7), f"{family}: layer {layer} (attention: {has}): {effect:.3g}"


@pytest.mark.parametrize(("family", "gain"), [("falcon_h1", 2.0), ("granitemoehybrid", 1.0)])
def test_causal_trace_noise_is_in_residual_units(family, gain):
    """Falcon-H1 multiplies its embeddings (2.0 in the tiny model) after the bridge's embedding hook, Granite
    4.0's bridge folds the same multiplier into the hook: the noise added at the hook is divided by the
    factor the model applies afterwards, so ``noise_std`` is the std the residual stream receives
    (measured on blocks.0.hook_resid_pre, which is the scaled embedding on both)."""
    from capinterp.kernels.tracing import embed_gain, embed_hook

    model, _, tok = _pair(family)
    assert ci.family_of(model).embedding_multiplier == 2.0
    assert embed_gain(model) == gain
    ids = tok("The Eiffel Tower is in", return_tensors="pt")["input_ids"]
    noise = torch.randn(1, ids.shape[1], int(model.cfg.d_model)) * 0.7
    _, clean = model.run_with_cache(ids, names_filter="blocks.0.hook_resid_pre")
    with model.hooks(fwd_hooks=[(embed_hook(model), lambda x, hook: x + noise / gain)]):
        _, noisy = model.run_with_cache(ids, names_filter="blocks.0.hook_resid_pre")
    added = noisy["blocks.0.hook_resid_pre"] - clean["blocks.0.hook_resid_pre"]
    torch.testing.assert_close(added, noise, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("family", FAMILIES)
def test_attention_scaling_reaches_the_attention_layers(family):
    """Attention scaling (knowledge synapses) scales the attention layers by default; a layer without
    attention is refused, naming the layers with it. Scaling the subject's keys by 0 changes p(target)."""
    from capinterp.interventions.attention_scaling import attention_scaling

    model = _pair(family)[0]
    attending = [l for l, b in enumerate(model.blocks) if getattr(b, "attn", None) is not None]
    if family in OBSERVE_ONLY:
        with pytest.raises(
            UnsupportedFamily, match=rf"writing blocks\.{attending[0]}\.attn\.hook_pattern does not reach"
        ):
            attention_scaling(model, FACTS[:2], factors=[0.0], control=False)
        return
    rows = attention_scaling(model, FACTS[:2], factors=[0.0], control=False)
    assert rows["delta"].notna().all() and float(rows["delta"].abs().max()) > 0
    if 0 not in attending:
        with pytest.raises(UnsupportedFamily, match=rf"layers \[0\] have no softmax attention.*{attending}"):
            attention_scaling(model, FACTS[:1], factors=[0.0], layers=[0])


@pytest.mark.parametrize("family", ["bamba", "jamba", "nemotron_h"])
def test_grad_x_act_runs_the_whole_sequence_on_hybrids(family):
    """Gradient x activation equals the hand computation (one full forward per layer): on a hybrid it does
    not continue from a prefix's recurrent state, which transformers does not reproduce on every family
    (Bamba's continuation was off by 9 %, Jamba's by 29 %)."""
    from ig_reference import ref_grad_x_act

    from capinterp.core.example import Example
    from capinterp.core.tokens import encode
    from capinterp.kernels.ig import grad_x_act

    model = _pair(family)[0]
    enc = encode(model, [Example("The Eiffel Tower is in the city of", " Paris is")])
    got, ref = grad_x_act(model, enc)[0], ref_grad_x_act(model, enc[0])
    assert float((got - ref).abs().max()) <= 1e-4 * float(ref.abs().max())
