"""A neuron planted in one expert of tiny MoE models: every neuron localizer ranks it first, and its
expert ranks first among experts (issue 27: experts as first-class units).

The plant is written by hand on the transformers weights (not through capinterp): the router
sends the prompts' last token to expert E (its router row points along the layer's input there),
neuron J of E reads that input through its gate and up rows, and its value vector writes the
target's unembedding direction.
"""

from __future__ import annotations

import pytest
import torch
from moe_tiny import MOE_FAMILIES, load_tiny_moe, moe_block

import capinterp as ci
from capinterp.data import Example
from capinterp.units.experts import expert_neurons, expert_scores, top_experts

FAMILIES = MOE_FAMILIES
LAYER, EXPERT, NEURON = 1, 2, 7
# FlexOlmo normalizes each FFN's output: summed over an expert, the many small scores of layer 0's
# expert 1 outrank the planted expert across layers (it still ranks first in its layer, and the
# planted neuron first of all)
GLOBAL_EXCEPTIONS = {"flex_olmo"}
VALUE = 1.0  # the planted value vector's length (Laguna needs more than 0.3 for p(Paris) > 0.02)
PROMPTS = ("The Eiffel Tower is in the city of", "The Eiffel Tower is located in", "Paris is the capital of")


_block = moe_block


def _layout(ex) -> tuple[bool, bool, bool]:
    """``(transposed, concatenated, has_bias)`` of a stacked-experts module from transformers' flags;
    Llama 4's experts carry none: ``gate_up_proj [E, d_model, 2 d]`` (gate half first), ``down_proj
    [E, d, d_model]``, no biases (transformers' Llama4TextExperts)."""
    if not hasattr(ex, "is_transposed"):
        return True, True, False
    return bool(ex.is_transposed), bool(getattr(ex, "is_concatenated", True)), bool(ex.has_bias)


@torch.no_grad()
def _plant(model, hf, tok) -> int:
    target = tok(" Paris")["input_ids"][0]  # the first target token (the localizers score it)
    ids = [tok(p, return_tensors="pt")["input_ids"] for p in PROMPTS]
    block = _block(hf, LAYER)
    seen = []  # the MoE block's input at the last token, as transformers hands it over (pre- or post-norm families)
    handle = block.register_forward_pre_hook(lambda _m, args: seen.append(args[0].reshape(-1, args[0].shape[-1])[-1]))
    with torch.no_grad():
        for i in ids:
            model(i)
    handle.remove()
    u = torch.nn.functional.normalize(torch.stack(seen).mean(0), dim=0)
    router = getattr(block, "router", None) or block.gate
    router = getattr(router, "original_component", router)
    inner = getattr(router, "gate", None) or getattr(router, "layer", None) or getattr(router, "wg", None)
    weight = router.weight if isinstance(getattr(router, "weight", None), torch.Tensor) else inner.weight
    weight[EXPERT] = 4.0 * u  # the router's logits (AFMoE's, JetMoE's and HunYuan's are its inner Linear's)
    ex = getattr(block.experts, "original_component", block.experts)
    transposed, concatenated, has_bias = _layout(ex)
    d = ex.down_proj.shape[1] if transposed else ex.down_proj.shape[2]
    rows = [NEURON, d + NEURON] if concatenated else [2 * NEURON, 2 * NEURON + 1]
    gated = getattr(ex, "has_gate", True)  # NemotronH's experts: act(up(x)), no gate
    name, rows = ("gate_up_proj", rows) if gated else ("up_proj", [NEURON])
    if transposed:
        getattr(ex, name)[EXPERT][:, rows] = 1.5 * u[:, None]
    else:
        getattr(ex, name)[EXPERT][rows] = 1.5 * u
    if has_bias:
        getattr(ex, f"{name}_bias")[EXPERT][rows] = 0.0
    layer = hf.model.layers[LAYER]
    layer = getattr(layer, "original_component", layer)  # transformers' decoder layer behind the bridge's
    for name, norm in layer.named_children():  # a norm on the FFN's output (FlexOlmo,
        if name in ("post_feedforward_layernorm", "post_mlp_layernorm"):  # AFMoE) caps the plant's reach:
            norm.weight.mul_(8.0)  # widen it, so the planted branch dominates the residual
    w_u = model.W_U[:, target]
    value = VALUE * w_u / w_u.norm()
    if transposed:
        ex.down_proj[EXPERT][NEURON] = value
    else:
        ex.down_proj[EXPERT][:, NEURON] = value
    return target


# Granite 4.0 divides its logits by logits_scaling (4 in the matrix's tiny model): after the final norm no
# logit exceeds |W_U[:, t]| sqrt(d_model) / 4 (~1.4 here), too little for p(Paris) > 0.02 over 512 tokens
PLANT_CONFIG = {"granitemoehybrid": dict(logits_scaling=1.0)}


@pytest.fixture(scope="module", params=FAMILIES)
def planted(request):
    model, _, tok, hf = load_tiny_moe(request.param, **PLANT_CONFIG.get(request.param, {}))
    target = _plant(model, hf, tok)
    model.capinterp_fingerprint = None  # weights changed after load
    data = [Example(p, " Paris") for p in PROMPTS]
    return request.param, model, tok, target, data


def _top(scores) -> tuple[int, int]:
    flat = int(scores.flatten().argmax())
    return divmod(flat, scores.shape[1])


def test_plant_changes_the_prediction(planted):
    family, model, tok, target, data = planted
    with torch.no_grad():
        probs = [model(tok(p, return_tensors="pt")["input_ids"])[0, -1].softmax(-1)[target].item() for p in PROMPTS]
    planted_neuron = expert_neurons(model, [(LAYER, EXPERT)])
    with ci.erase(model, planted_neuron), torch.no_grad():
        erased = [model(tok(p, return_tensors="pt")["input_ids"])[0, -1].softmax(-1)[target].item() for p in PROMPTS]
    assert min(probs) > 0.02, f"{family}: the plant does not drive p(Paris): {probs}"
    assert max(e / p for e, p in zip(erased, probs)) < 0.5, f"{family}: erasing the expert kept p(Paris): {erased}"


@pytest.mark.parametrize("method", ["kn", "cnl", "dcsn"])
def test_localizers_rank_the_planted_neuron_and_expert_first(planted, method):
    family, model, _, _, data = planted
    cls = ci.localizers.get(method)
    loc = (cls(model) if method == "dcsn" else cls(model, progress=False)).fit(data)
    scores = loc.scores_.scores
    d_expert = model.capinterp_family.moe.d_expert
    assert _top(scores) == (LAYER, EXPERT * d_expert + NEURON), f"{family} {method}: top neuron {_top(scores)}"
    per = expert_scores(model, loc.scores_)
    assert int(per[LAYER].argmax()) == EXPERT, f"{family} {method}: top expert of layer {LAYER}: {per[LAYER]}"
    if family in GLOBAL_EXCEPTIONS:
        return
    assert _top(per) == (LAYER, EXPERT), f"{family} {method}: top expert {_top(per)}"
    assert top_experts(model, loc.scores_, 1).keys() == {(LAYER, EXPERT)}


def test_heatmap_shows_experts(planted):
    """The heatmap of MoE scores separates and names the experts, and its hover names each block's expert."""
    from capinterp.plots import neuron_heatmap

    family, model, _, _, data = planted
    scores = ci.localizers.get("dcsn")(model).fit(data).scores_
    moe = model.capinterp_family.moe
    fig = neuron_heatmap(scores)
    ticks = list(fig.layout.xaxis.ticktext)
    assert ticks[:2] == ["expert 0", "expert 1"] and (ticks[-1] == "shared") == bool(moe.d_shared)
    assert len(fig.layout.shapes) == moe.n_experts - 1 + bool(moe.d_shared)
    row = fig.data[0].text[LAYER]
    hover = [cell for cell in row if f"at neuron {EXPERT * moe.d_expert + NEURON}" in cell]
    assert hover and hover[0].startswith(f"expert {EXPERT}: "), row[:3]
