"""WIP (issue 27): dense and MoE layers mixed in one model (DeepSeek's first_k_dense_replace)."""

from __future__ import annotations

import copy
import warnings

import torch

import capinterp as ci
from capinterp.core.tiny import tiny_hf

EX = [ci.Example("The Eiffel Tower is in the city of", " Paris"), ci.Example("Rome is the capital of", " Italy")]


def _mixed():
    hf, tok = tiny_hf("deepseek_v2", first_k_dense_replace=1, intermediate_size=64)
    plain = copy.deepcopy(hf)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ci.load_model(hf, tokenizer=tok), plain, tok


@torch.no_grad()
def test_a_dense_first_layer_loads_and_matches_transformers():
    model, plain, tok = _mixed()
    ids = tok(EX[0].prompt, return_tensors="pt")["input_ids"]
    want = plain(ids).logits
    assert float((model(ids) - want).abs().max()) <= 1e-5 * float(want.abs().max())


def test_padding_neurons_score_exactly_zero():
    model, _, _ = _mixed()
    width = model.capinterp_family.moe.width
    assert model.cfg.d_mlp == width
    for name in ("kn", "dcsn"):
        s = ci.localizers.get(name)(model, progress=False).fit(EX).scores_.scores
        assert s.shape == (2, width) and float(s[0, 64:].abs().max()) == 0.0 and float(s[0, :64].abs().max()) > 0
