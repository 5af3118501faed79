"""Neuron-level fine-tuning: frozen entries stay bit-identical, the caller's model is untouched,
planted neurons learn, the random arm follows its seed, and bad inputs fail clearly."""

import copy

import pytest
import torch
from planting import PLANTED, plant

import capinterp as ci
from capinterp.arch.model import neuron_param_info
from capinterp.data import Example
from capinterp.interventions.finetune import ARMS, FinetuneResult, finetune
from capinterp.interventions.neuron_params import neuron_masks, neuron_slices, zero_neurons
from capinterp.units.neurons import NeuronSet

TOY = [Example(f"{a}+{b}=", "7") for a, b in [(3, 4), (5, 2), (1, 6), (2, 5), (4, 3), (6, 1)]]
KW = dict(lr=1e-2, epochs=3, batch_size=3, progress=False)


def _set(model, pairs):
    return NeuronSet.from_indices(pairs, model.cfg.n_layers, model.cfg.d_mlp)


def _snapshot(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def _tl_views(model, layer):
    mlp = model.blocks[layer].mlp
    return {"W_in": mlp.W_in, "W_gate": mlp.W_gate, "W_out": mlp.W_out.T}  # all [d_model, d_mlp]


def _mlp_param_names(model):
    return {n for n, _ in model.named_parameters() if "mlp" in n}


def test_masks_follow_the_tl_layout(tiny):
    ns = _set(tiny, PLANTED)
    masks = neuron_masks(tiny, ns)
    assert sum(int(m.sum()) for m in masks.values()) == len(ns) * neuron_param_info(tiny)["params_per_neuron"]
    # the bridge stores up/gate as [d_mlp, d_model] (neuron = row) and down as [d_model, d_mlp] (column)
    axes = {(s.layer, s.kind): s.axis for s in neuron_slices(tiny)}
    assert axes[(1, "W_in")] == 0 and axes[(1, "W_gate")] == 0 and axes[(1, "W_out")] == 1


@pytest.mark.parametrize("arm", ["located", "random"])
def test_frozen_entries_bit_identical_and_located_entries_change(tiny, arm):
    ns = _set(tiny, PLANTED)
    before = _snapshot(tiny)
    res = finetune(tiny, TOY, neurons=ns, arms=(arm,), keep_models=True, **KW)
    trained = res.models[arm]
    chosen = res.neurons[arm]
    assert arm != "random" or chosen != ns
    after = dict(trained.named_parameters())
    mlp = _mlp_param_names(tiny)
    for name, p in before.items():
        if name not in mlp:
            assert torch.equal(p, after[name]), name  # attention, norms, embeddings: untouched
    for layer in range(tiny.cfg.n_layers):
        idx = chosen.mask[layer]
        for kind, view in _tl_views(trained, layer).items():
            orig = _tl_views(tiny, layer)[kind]
            assert torch.equal(view[:, ~idx], orig[:, ~idx]), (layer, kind)  # every other neuron: bit-identical
            if idx.any():  # every trained column moved (Adam moves each entry with a nonzero gradient)
                assert (view[:, idx] != orig[:, idx]).float().mean() > 0.9, (layer, kind)
    assert res.table.loc[0, "n_trainable_params"] == len(chosen) * neuron_param_info(tiny)["params_per_neuron"]
    for name, p in tiny.named_parameters():  # the caller's model is unchanged
        assert torch.equal(p, before[name])


def test_without_located_keeps_located_zero_and_trains_the_rest(tiny):
    ns = _set(tiny, PLANTED)
    res = finetune(tiny, TOY, neurons=ns, arms=("without_located",), keep_models=True, **KW)
    trained = res.models["without_located"]
    for layer, idx in PLANTED:
        for kind, view in _tl_views(trained, layer).items():
            assert torch.count_nonzero(view[:, idx]) == 0, (layer, kind)
    changed = [n for n, p in trained.named_parameters() if not torch.equal(p, dict(tiny.named_parameters())[n])]
    assert any("self_attn" in n for n in changed) and any("mlp" in n for n in changed)
    n_all = sum(p.numel() for p in tiny.parameters())
    assert res.table.loc[0, "n_trainable_params"] == n_all - 3 * neuron_param_info(tiny)["params_per_neuron"]
    # zeroing the weights is the same as erasing the neurons with hooks
    ids = tiny.to_tokens("3+4=")
    fresh = copy.deepcopy(tiny)
    zero_neurons(fresh, ns)
    with ci.erase(tiny, ns):
        torch.testing.assert_close(fresh(ids), tiny(ids), rtol=0, atol=1e-6)


def test_callers_model_unchanged_and_result_shape(tiny):
    ns = _set(tiny, PLANTED)
    before = _snapshot(tiny)
    flags = {n: p.requires_grad for n, p in tiny.named_parameters()}
    res = finetune(tiny, TOY, neurons=ns, eval_data={"toy": TOY[:4]}, **KW)
    assert isinstance(res, FinetuneResult) and list(res.table["arm"]) == list(ARMS)
    for col in (
        "n_trainable_params",
        "param_share",
        "train_loss_before",
        "train_loss_after",
        "toy_acc_before",
        "toy_acc_after",
        "s_per_epoch",
    ):
        assert col in res.table.columns
    assert res.models == {}
    assert len(res.history) == len(ARMS) * 3 * 2
    assert set(res.evals["stage"]) == {"before", "after"}
    assert res.table.set_index("arm").loc["full", "param_share"] == 1.0
    assert len(res.plot().data) == 2 * 2  # (train loss, toy accuracy) x (before, after)
    for name, p in tiny.named_parameters():
        assert torch.equal(p, before[name]), name
        assert p.requires_grad == flags[name]


def test_inplace_trains_the_callers_model(tiny):
    m = copy.deepcopy(tiny)
    before = _snapshot(m)
    res = finetune(m, TOY, neurons=_set(m, PLANTED), arms=("located",), inplace=True, **KW)
    assert res.models["located"] is m
    assert any(not torch.equal(p, before[n]) for n, p in m.named_parameters())


def test_planted_neurons_learn_the_toy_task(tiny):
    m = copy.deepcopy(tiny)
    plant(m, TOY, gain=1.0, write=0.05)  # weakly planted: room to learn
    res = finetune(m, TOY, neurons=_set(m, PLANTED), arms=("located",), device="cpu", **KW)
    row = res.table.iloc[0]
    assert row["train_loss_after"] < 0.8 * row["train_loss_before"]
    assert res.history["loss"].iloc[-1] < res.history["loss"].iloc[0]


def test_random_arm_uses_the_seed(tiny):
    ns = _set(tiny, PLANTED)

    def run(seed):
        return finetune(tiny, TOY, neurons=ns, arms=("random",), seed=seed, **KW)

    a, b, c = run(0), run(0), run(1)
    assert a.neurons["random"] == b.neurons["random"] == ns.random_like(0)
    assert a.neurons["random"] != c.neurons["random"]
    assert len(c.neurons["random"]) == len(ns)
    assert a.table.loc[0, "train_loss_after"] == b.table.loc[0, "train_loss_after"]


def test_bad_inputs(tiny):
    ns = _set(tiny, PLANTED)
    cases = [
        (dict(train=[]), "empty training set"),
        (dict(lr=0), "lr"),
        (dict(lr=-1e-3), "lr"),
        (dict(lr=float("nan")), "lr"),
        (dict(epochs=0), "epochs"),
        (dict(epochs=1.5), "epochs"),
        (dict(batch_size=0), "batch_size"),
        (dict(arms=("located", "lora")), "arms"),
        (dict(arms=("full", "full")), "arms"),
        (dict(arms=()), "arms"),
        (dict(neurons=None), "need neurons"),
        (dict(neurons=ns.empty_like()), "empty"),
        (dict(inplace=True), "exactly one arm"),
        (dict(lr={"located": 1e-3}), "one entry per arm"),
        (dict(arms=("located",), lr={"located": 0.0}), "lr"),
        (dict(eval_data={"x": []}), "empty"),
        (dict(neurons=NeuronSet.from_indices([(0, 1)], tiny.cfg.n_layers, tiny.cfg.d_mlp + 1)), "made for a model"),
    ]
    for over, msg in cases:
        kw = dict(train=TOY, neurons=ns, lr=1e-3, progress=False) | over
        with pytest.raises(ValueError, match=msg):
            finetune(tiny, kw.pop("train"), **kw)
    other = NeuronSet(ns.mask, {"model_fingerprint": "0123456789abcdef"})
    with pytest.raises(ValueError, match="fingerprint|model"):
        finetune(tiny, TOY, neurons=other, progress=False)
    with pytest.raises(TypeError):
        finetune(tiny, TOY, neurons=[(1, 5)], progress=False)


def test_learning_rate_per_arm(tiny):
    res = finetune(
        tiny,
        TOY,
        neurons=_set(tiny, PLANTED),
        arms=("located", "full"),
        **(KW | {"lr": {"located": 1e-2, "full": 1e-4}}),
    )
    assert list(res.table["lr"]) == [1e-2, 1e-4]
    assert res.config["lr"] == {"located": 1e-2, "full": 1e-4}


def test_arms_do_not_leak_into_each_other(tiny):
    ns = _set(tiny, PLANTED)
    alone = finetune(tiny, TOY, neurons=ns, arms=("located",), **KW).table.set_index("arm")
    after = finetune(tiny, TOY, neurons=ns, arms=("without_located", "full", "located"), **KW).table.set_index("arm")
    assert after.loc["located", "train_loss_after"] == alone.loc["located", "train_loss_after"]
    assert after.loc["located", "train_loss_before"] == alone.loc["located", "train_loss_before"]
