"""Hybrid models (Qwen3-Next, Qwen3.5-MoE, OLMo-Hybrid: linear-attention layers beside softmax
attention; Bamba, Jamba: Mamba layers; Falcon-H1: attention and Mamba side by side; LFM2, LFM2-MoE:
short-convolution layers): served at load; neuron methods run (IG on route "loop": such a
layer carries a recurrent or convolution state, not a key/value cache); methods that need attention
in every layer refuse, naming why."""

from __future__ import annotations

import copy
import functools
import re
import warnings

import pytest
import torch

import capinterp as ci
from capinterp.core.family import UnsupportedFamily
from capinterp.core.tiny import TINY_FAMILIES, TINY_HYBRID, tiny_hf

FAMILIES = tuple(TINY_HYBRID)
FACTS = [
    ci.Example("The Eiffel Tower is in the city of", " Paris", meta={"subject": "The Eiffel Tower"}),
    ci.Example("Rome is the capital of", " Italy", meta={"subject": "Rome"}),
]


def _kinds(family: str) -> list[str]:
    """The tiny model's layer kinds (its transformers config's layer_types)."""
    from transformers import AutoConfig

    cfg = AutoConfig.for_model(family)
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


@pytest.mark.parametrize("family", FAMILIES)
def test_ig_runs_the_loop_route_and_says_why(family):
    model = _pair(family)[0]
    with pytest.warns(RuntimeWarning, match="state of their own.*route='loop'"):
        fast = ci.KN(model, progress=False).fit(FACTS).scores_.scores
    loop = ci.KN(model, progress=False, route="loop").fit(FACTS).scores_.scores
    assert torch.equal(fast, loop) and float(fast.abs().max()) > 0


@pytest.mark.parametrize("family", FAMILIES)
def test_methods_needing_attention_everywhere_refuse_naming_the_mixer(family):
    model = _pair(family)[0]
    why = rf"{family}.*needs softmax attention in every layer.*{re.escape(str(list(_mixers(family))))}"
    with pytest.raises(UnsupportedFamily, match=why):
        ci.localizers.get("knowledge_circuit")(model, progress=False).fit(FACTS)
    with pytest.raises(UnsupportedFamily, match=why):
        ci.localizers.get("causal_trace")(model, top_k=1, progress=False).fit(FACTS)  # default kinds include "attn"
    from capinterp.circuits.head_patching import head_effects

    with pytest.raises(UnsupportedFamily, match=why):
        head_effects(model, FACTS)
    from capinterp.interventions.attention_scaling import attention_scaling

    with pytest.raises(UnsupportedFamily, match=why):
        attention_scaling(model, FACTS, factors=[2.0])
    from capinterp.plots.tokens import attention_pattern

    if _kinds(family)[0] == "hybrid":  # Falcon-H1: attention beside Mamba in every layer, its pattern is real
        assert attention_pattern(model, FACTS[0].prompt, 0)[1].shape[0] == model.cfg.n_heads
    else:
        with pytest.raises(UnsupportedFamily, match=rf"{family}.*layer 0 has no softmax attention pattern"):
            attention_pattern(model, FACTS[0].prompt, 0)
    assert attention_pattern(model, FACTS[0].prompt, 1)[1].shape[0] == model.cfg.n_heads  # layer 1 attends
    trace = ci.localizers.get("causal_trace")(model, kinds=("resid", "mlp"), top_k=1, require_correct=False)
    assert set(trace.fit(FACTS).grids_) == {"resid", "mlp"}
