"""circuitsvis token views: the HTML carries the prompt's tokens and the right neuron's / head's numbers."""

import json
import re

import pytest
import torch
from planting import PLANTED, plant

import capinterp as ci
from capinterp.data import Example
from capinterp.plots import attention_view, neuron_activations_view
from capinterp.units.neurons import NeuronSet

EXAMPLES = [Example(f"{a}+{b}=", "7") for a, b in [(3, 4), (5, 2), (1, 6), (2, 5), (6, 1), (4, 3)]]
PROMPT = "3+4="


@pytest.fixture(scope="module")
def planted():
    m = ci.load_model("tiny")
    plant(m, EXAMPLES)
    return m


def _props(html) -> dict:
    """The props circuitsvis passes its component: the JSON object in the render call."""
    found = re.search(r'render\(\s*"[^"]+",\s*\w+,\s*(\{.*\})\s*\)\s*</script>', str(html), re.S)
    return json.loads(found.group(1))


def _hooked(model, name: str) -> torch.Tensor:
    """``name``'s activation on PROMPT, read with a plain hook (the reference)."""
    from capinterp.core.tokens import model_bos

    ids = model_bos(model) + list(model.tokenizer(PROMPT, add_special_tokens=False)["input_ids"])
    box = []
    model.run_with_hooks(torch.tensor([ids]), fwd_hooks=[(name, lambda x, hook: box.append(x.detach()))])
    return box[0][0]


def test_neuron_view_shows_planted_neurons_activations(planted):
    neurons = NeuronSet(torch.zeros(planted.cfg.n_layers, planted.cfg.d_mlp, dtype=torch.bool))
    for layer, idx in PLANTED:
        neurons.mask[layer, idx] = True
    props = _props(neuron_activations_view(planted, PROMPT, neurons))
    toks = props["tokens"]
    assert "".join(toks).endswith(PROMPT) and "4" in toks
    assert props["secondDimensionLabels"] == [f"L{l} N{i}" for l, i in PLANTED]
    acts = torch.tensor(props["activations"])  # [T, 1, K]
    assert acts.shape == (len(toks), 1, len(PLANTED))
    for k, (layer, idx) in enumerate(PLANTED):
        ref = _hooked(planted, f"blocks.{layer}.mlp.hook_post")[:, idx]
        torch.testing.assert_close(acts[:, 0, k], ref.float(), rtol=1e-5, atol=1e-6)
    # planted neurons fire hardest at the last token (where they were planted), and far above a
    # neighbour that was not planted
    assert all(int(acts[:, 0, k].argmax()) == len(toks) - 1 for k in range(len(PLANTED)))
    layer, idx = PLANTED[-1]
    other = _hooked(planted, f"blocks.{layer}.mlp.hook_post")[-1, idx + 1].abs()
    assert acts[-1, 0, -1] > 5 * other


def test_attention_view_matches_hook_pattern(planted):
    props = _props(attention_view(planted, PROMPT, layer=1, heads=[0, 2]))
    ref = _hooked(planted, "blocks.1.attn.hook_pattern")[[0, 2]]
    torch.testing.assert_close(torch.tensor(props["attention"]), ref.float(), rtol=1e-5, atol=1e-6)
    assert "".join(props["tokens"]).endswith(PROMPT)
    full = _props(attention_view(planted, PROMPT, layer=0))
    assert len(full["attention"]) == planted.cfg.n_heads
    assert PROMPT[-1] in str(attention_view(planted, PROMPT, layer=0))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"layer": 99}, "layer must be"),
        ({"layer": 0, "heads": [99]}, "heads must be"),
        ({"layer": 0, "heads": []}, "heads must be"),
    ],
)
def test_attention_view_bad_input(tiny, kwargs, match):
    with pytest.raises(ValueError, match=match):
        attention_view(tiny, PROMPT, **kwargs)


def test_neuron_view_bad_input(tiny):
    with pytest.raises(ValueError, match="out of range"):
        neuron_activations_view(tiny, PROMPT, [(0, 10**6)])
    with pytest.raises(ValueError, match="neurons is empty"):
        neuron_activations_view(tiny, PROMPT, [])
    with pytest.raises(TypeError, match="pairs"):
        neuron_activations_view(tiny, PROMPT, [3])
    with pytest.raises(ValueError, match="prompt must be"):
        neuron_activations_view(tiny, "", [(0, 0)])
