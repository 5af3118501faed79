"""NeFT: the neurons a short full fine-tune turns most, on a planted fact; exact restoration; bad input."""

import pytest
import torch
from fact_planting import FACT_A, NEURONS_A, NEURONS_B, plant_facts

import capinterp as ci
from capinterp.data import Example
from capinterp.localizers.neft import neuron_weights

# re-teach fact A a new answer: the gradient flows through A's planted neurons, which fire ~100x
# harder than any other neuron on A's prompts, so their weights turn most
RETEACH = [Example(e.prompt, " Tokyo") for e in FACT_A]


@pytest.fixture(scope="module")
def planted():
    m = ci.load_model("tiny")
    plant_facts(m)
    return m


def test_neft_finds_the_neurons_a_planted_task_moves(planted):
    state = {k: v.clone() for k, v in planted.state_dict().items()}
    neft = ci.NeFT(planted, steps=5, lr=1e-2, top_k=6, progress=False).fit(RETEACH)
    assert set(NEURONS_A) <= set(neft.neurons_)  # the 3 planted among the top 6 of 512
    s = neft.scores_.scores
    a_min = min(float(s[l, i]) for l, i in NEURONS_A)
    assert a_min > 20 * float(s.median())
    assert max(float(s[l, i]) for l, i in NEURONS_B) < a_min / 5  # B's neurons are shut on A's prompts
    assert neft.losses_[-1] < neft.losses_[0]
    after = planted.state_dict()
    assert all(torch.equal(state[k], after[k]) for k in state)  # weights restored bit for bit
    assert all(p.grad is None for p in planted.parameters())
    assert neft.scores_.meta["method"] == "neft" and ci.localizers.get("neft") is ci.NeFT


def test_neuron_weights_layout(planted):
    w = neuron_weights(planted, 1)
    mlp = planted.blocks[1].mlp
    assert w.shape == (128, 64 * 3)
    assert torch.equal(w[5, -64:], mlp.out.original_component.weight[:, 5].detach().double())


def test_scores_are_one_minus_cosine(planted):
    neft = ci.NeFT(planted, steps=1, lr=1e-3, progress=False).fit(RETEACH[:1])
    assert neft.scores_.scores.min() >= -1e-6 and neft.scores_.scores.max() <= 2
    assert len(neft.neurons_) == round(0.01 * 4 * 128)


def test_bad_parameters(planted):
    for kw, match in (
        ({"steps": 0}, "steps"),
        ({"lr": 0}, "lr"),
        ({"optimizer": "rmsprop"}, "optimizer"),
        ({"top_k": 0}, "top_k"),
    ):
        with pytest.raises(ValueError, match=match):
            ci.NeFT(planted, **kw)
    with pytest.raises(ValueError, match="top_k"):  # above the model's neuron count: checked in fit
        ci.NeFT(planted, top_k=10**6, progress=False).fit(RETEACH[:1])
    with pytest.raises(ValueError, match="empty dataset"):
        ci.NeFT(planted).fit([])
    with pytest.raises(ValueError, match="empty target"):  # a bare prompt: NeFT trains on the answer
        ci.NeFT(planted).fit(["3+4="])
