"""Weights of a mixed dense / MoE model's dense layer on the experts' padded neuron axis (tiny
DeepSeek-V2: layer 0 dense with 64 neurons, layer 1 MoE, W = 240), against plain transformers:
value vectors, owned entries, NeFT's rows, finetune masks, knowledge editing, erase / scale,
ROME on the dense layer; expert units skip the dense layer; heatmaps do not draw padding."""

from __future__ import annotations

import copy
import functools

import numpy as np
import pytest
import torch
from moe_tiny import MIXED_DENSE, load_tiny_mixed

import capinterp as ci
from capinterp.arch.experts import DenseBlock
from capinterp.arch.model import model_meta
from capinterp.arch.neuron_weights import neuron_params
from capinterp.arch.weights import down_projection
from capinterp.core.tokens import encode
from capinterp.interventions.faithfulness import _references, faithfulness
from capinterp.interventions.neuron_params import neuron_masks
from capinterp.localizers.neft import neuron_weights
from capinterp.plots.heatmaps import neuron_heatmap
from capinterp.units.base import KeySet
from capinterp.units.experts import dense_layers, expert_neurons, expert_scores, top_experts
from capinterp.units.neurons import NeuronScores, NeuronSet

EX = [ci.Example("The Eiffel Tower is in the city of", " Paris"), ci.Example("Rome is the capital of", " Italy")]
DENSE, D, E, DE = MIXED_DENSE, 32, 4, 48  # dense neurons, d_model, experts, d_expert (shared expert: 48 more)
W = E * DE + DE


def _fresh():
    """A new tiny mixed model (tests that write weights get their own) and a plain transformers copy."""
    return load_tiny_mixed()


@functools.cache
def _shared():
    """Shared by the read-only tests: must not be written."""
    return _fresh()


def _ids(tok, prompt: str = EX[0].prompt) -> torch.Tensor:
    return tok(prompt, return_tensors="pt")["input_ids"]


def _dense_mlp(plain):
    return plain.model.layers[0].mlp


def _neurons(model, pairs) -> NeuronSet:
    mask = torch.zeros(2, W, dtype=torch.bool)
    for l, i in pairs:
        mask[l, i] = True
    return NeuronSet(mask, meta=model_meta(model))


@torch.no_grad()
def _close(model, plain, tok, rtol: float = 1e-5) -> None:
    ids = _ids(tok)
    want = plain(ids).logits
    assert float((model(ids) - want).abs().max()) <= rtol * float(want.abs().max())


# ---- task 1: weights of the dense layer


def test_dense_layer_value_vectors_are_its_down_projection_then_zero_padding():
    model, plain, _ = _shared()
    proj = down_projection(model, 0)
    w = _dense_mlp(plain).down_proj.weight  # [d_model, 64]
    v = proj.values()
    assert v.shape == (W, D) and torch.equal(v[:DENSE], w.T) and not bool(v[DENSE:].ne(0).any())
    keys = torch.randn(3, W)
    assert torch.allclose(proj.apply(keys), keys[:, :DENSE] @ w.T, atol=1e-5)
    assert isinstance(model.capinterp_experts[0], DenseBlock) and dense_layers(model) == [0]


def test_writing_padding_is_refused_and_real_rows_write_the_dense_down_projection():
    model, plain, tok = _fresh()
    proj = down_projection(model, 0)
    w0 = _dense_mlp(plain).down_proj.weight.detach().clone()
    with pytest.raises(ValueError, match="padding"):
        proj.write_rows(torch.tensor([3, DENSE + 1]), torch.ones(2, D))
    bad = torch.zeros(W, D)
    bad[W - 1, 0] = 1.0
    with pytest.raises(ValueError, match="padding"):
        proj.add(bad)
    with pytest.raises(ValueError, match="padding"):
        proj.write(proj.values() + bad)
    assert torch.equal(proj.values()[:DENSE], w0.T)  # nothing written by the refused calls
    # real rows (and zero rows into padding) write the dense down_proj's columns
    rows = torch.randn(3, D)
    proj.write_rows(torch.tensor([2, 40, DENSE + 5]), torch.cat([rows[:2], torch.zeros(1, D)]))
    delta = torch.zeros(W, D)
    delta[7] = rows[2]
    proj.add(delta)
    with torch.no_grad():
        dw = _dense_mlp(plain).down_proj.weight
        dw[:, 2], dw[:, 40] = rows[0], rows[1]
        dw[:, 7] += rows[2]
    assert not bool(proj.values()[DENSE:].ne(0).any())
    _close(model, plain, tok)


def test_owned_entries_of_dense_and_padding_neurons():
    model, plain, _ = _shared()
    params = {p.kind: p for p in neuron_params(model, [0])}
    mlp = _dense_mlp(plain)
    assert set(params) == {"W_gate", "W_in", "W_out"}
    idx = torch.tensor([5, DENSE, W - 1])  # one real neuron, two padding neurons
    for kind, ref in (("W_gate", mlp.gate_proj.weight[5]), ("W_in", mlp.up_proj.weight[5])):
        assert torch.equal(params[kind].param[params[kind].entries(idx)], ref[None])
    assert torch.equal(params["W_out"].param[params["W_out"].entries(idx)], mlp.down_proj.weight[:, 5:6])
    for p in params.values():  # padding owns nothing
        assert p.param[p.entries(torch.tensor([DENSE, W - 1]))].numel() == 0
    assert model_meta(model)["params_per_neuron"] == 3 * D
    masks = {
        n.replace("._original_component", ""): m
        for n, m in neuron_masks(model, _neurons(model, [(0, 5), (0, 63)])).items()
    }
    for name, p in plain.named_parameters():
        want = torch.zeros_like(p, dtype=torch.bool)
        if name in ("model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.up_proj.weight"):
            want[[5, 63]] = True
        elif name == "model.layers.0.mlp.down_proj.weight":
            want[:, [5, 63]] = True
        assert torch.equal(masks.get(name, torch.zeros_like(want)), want), name


def test_neft_rows_and_scores_are_zero_on_padding():
    model, plain, _ = _shared()
    mlp = _dense_mlp(plain)
    rows = neuron_weights(model, 0)
    want = torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight.T], 1).double()
    assert rows.shape == (W, 3 * D) and torch.equal(rows[:DENSE], want) and not bool(rows[DENSE:].ne(0).any())
    s = ci.localizers.get("neft")(model, steps=2, lr=1e-2, progress=False).fit(EX).scores_.scores
    assert bool(torch.isfinite(s).all())
    assert float(s[0, DENSE:].abs().max()) == 0.0 and float(s[0, :DENSE].max()) > 0
    assert torch.equal(neuron_weights(model, 0), rows)  # NeFT puts the weights back


def test_finetune_changes_only_the_located_dense_neurons_entries():
    model, plain, _ = _shared()
    located = _neurons(model, [(0, 3), (0, 50)])
    res = ci.finetune(model, EX, neurons=located, arms=["located"], lr=1e-2, keep_models=True, progress=False)
    trained = {
        n.replace("._original_component", ""): p for n, p in res.models["located"].original_model.named_parameters()
    }
    own = {"gate_proj.weight": (slice(None), 0), "up_proj.weight": (slice(None), 0), "down_proj.weight": (1, None)}
    for name, p in plain.named_parameters():
        diff = trained[name].detach() - p.detach()
        short = name.replace("model.layers.0.mlp.", "")
        if name.startswith("model.layers.0.mlp.") and short in own:
            changed = diff.ne(0)
            axis = 0 if short != "down_proj.weight" else 1
            lines = changed.any(1 - axis).nonzero().flatten().tolist()
            assert set(lines) <= {3, 50} and lines, name
        else:
            assert not bool(diff.ne(0).any()), name


def test_edit_knowledge_writes_the_dense_columns():
    model, plain, tok = _fresh()
    located = _neurons(model, [(0, 3), (0, 50)])
    edit = ci.edit_knowledge(model, [EX[0]], mode="update", new_target=" Rome", neurons=located, evaluate=False)
    idx, rows = edit.values[0]
    assert sorted(idx.tolist()) == [3, 50]
    with edit.apply(model):
        with torch.no_grad():
            _dense_mlp(plain).down_proj.weight[:, idx] = rows.T.to(torch.float32)
        _close(model, plain, tok)
    assert torch.equal(down_projection(model, 0).values()[:DENSE].T, _shared()[1].model.layers[0].mlp.down_proj.weight)


@pytest.mark.parametrize("factor", [0.0, 2.0, -1.5])
def test_scaling_dense_neurons_scales_their_down_projection_columns(factor):
    model, plain, tok = _shared()
    idx = [1, 17, 63]
    ref = copy.deepcopy(plain)
    with torch.no_grad():
        ref.model.layers[0].mlp.down_proj.weight[:, idx] *= factor
    with ci.scale(model, _neurons(model, [(0, i) for i in idx]), factor):
        _close(model, ref, tok)
    if factor == 0.0:
        with ci.erase(model, _neurons(model, [(0, i) for i in idx])):
            _close(model, ref, tok)
    if factor == 2.0:
        with ci.amplify(model, _neurons(model, [(0, i) for i in idx])):
            _close(model, ref, tok)


def test_rome_edits_a_dense_layer_over_its_own_neurons_and_takes_no_expert_there():
    model, plain, tok = _fresh()
    gen = torch.Generator().manual_seed(0)
    keys = torch.randn(200, W, generator=gen)
    keys[:, DENSE:] = 0
    C = keys.T @ keys / 200
    C[DENSE:, DENSE:] += 7.0  # anything in the padding block is ignored
    fact = ci.Example("The Eiffel Tower is in the city of", " Paris")
    kw = dict(subject="The Eiffel Tower", second_moment_matrix=C, prefixes=[], steps=2)
    with pytest.raises(ValueError, match="expert=1 is for mixture-of-experts layers; layer 0 is dense"):
        ci.rome_edit(model, fact, " Rome", layer=0, expert=1, **kw)
    edit = ci.rome_edit(model, fact, " Rome", layer=0, ridge=0.1, **kw)
    # the left vector over the layer's 64 neurons (ridge from their own diagonal), 0 on padding
    k = edit.key[:DENSE].double()
    Cd = C[:DENSE, :DENSE].double()
    u = torch.linalg.solve(Cd + 0.1 * Cd.diagonal().mean() * torch.eye(DENSE, dtype=torch.float64), k)
    assert torch.allclose(edit.left[:DENSE].double(), u / (u @ k), rtol=1e-4, atol=1e-6)
    assert not bool(edit.left[DENSE:].ne(0).any()) and not bool(edit.key[DENSE:].ne(0).any())
    w = _dense_mlp(plain).down_proj.weight.detach().clone()
    assert torch.allclose(edit.value, w @ edit.key[:DENSE] + edit.delta, atol=1e-5)
    with edit:
        with torch.no_grad():
            _dense_mlp(plain).down_proj.weight.copy_(w + torch.outer(edit.delta, edit.left[:DENSE]))
        _close(model, plain, tok)
        assert torch.allclose(down_projection(model, 0).apply(edit.key[None])[0], edit.value, atol=1e-4)
    assert torch.equal(down_projection(model, 0).values()[:DENSE].T, w)


# ---- task 2: expert units


def test_expert_scores_rows_of_the_dense_layer_are_zero_and_never_picked():
    model = _shared()[0]
    s = -torch.rand(2, W) - 0.1  # every real score negative: a 0 row would win a plain top-k
    per = expert_scores(model, s)
    want = torch.stack([s[1, e * DE : (e + 1) * DE].sum() for e in range(E)] + [s[1, E * DE :].sum()])
    assert per.shape == (2, E + 1) and torch.equal(per[0], torch.zeros(E + 1)) and torch.allclose(per[1], want)
    top = top_experts(model, s, E + 1)
    assert top.n_units == E + 1 and {l for l, _ in top} == {1}
    names = [*range(E), "shared"]
    assert set(top_experts(model, s, 2).keys()) == {(1, names[int(i)]) for i in want.topk(2).indices}
    with pytest.raises(ValueError, match="k must be"):
        top_experts(model, s, E + 2)


def test_expert_keys_naming_the_dense_layer_are_refused():
    model = _shared()[0]
    with pytest.raises(ValueError, match="dense layer"):
        expert_neurons(model, [(0, 1)])
    with pytest.raises(ValueError, match="dense layer"):
        expert_neurons(model, [(0, "shared")])
    bad = KeySet([(0, 0)], "expert", ("expert", 2, E, True, (0,)), n_units=E + 1)
    with pytest.raises(ValueError, match="dense layer"):
        with ci.erase(model, bad):
            pass
    mask = expert_neurons(model, [(1, 2), (1, "shared")]).mask
    want = torch.zeros(2, W, dtype=torch.bool)
    want[1, 2 * DE : 3 * DE] = True
    want[1, E * DE :] = True
    assert torch.equal(mask, want)


def _plain_prob(plain, tok, examples) -> float:
    """Mean p(target's first token) at the last prompt position, on plain transformers."""
    probs = []
    for it in encode(_shared()[0], examples):
        with torch.no_grad():
            logits = plain(torch.tensor([it.prompt_ids])).logits[0, -1]
        probs.append(float(logits.double().softmax(-1)[it.target_ids[0]]))
    return sum(probs) / len(probs)


def test_expert_faithfulness_counts_and_ablates_only_expert_layers():
    model, plain, tok = _shared()
    located = KeySet([(1, 0)], "expert", ("expert", 2, E, True, (0,)), n_units=E + 1)
    res = faithfulness(model, located, EX, ablation="zero", random_sets=0)
    row = res.table.iloc[0]
    assert int(row["k"]) == 1 and row["fraction"] == pytest.approx(1 / (E + 1))
    # kept: only expert 0 of layer 1 runs, the dense layer 0 untouched; ablated: expert 0 zeroed
    kept, ablated = copy.deepcopy(plain), copy.deepcopy(plain)
    with torch.no_grad():
        kept.model.layers[1].mlp.experts.down_proj[1:] = 0
        kept.model.layers[1].mlp.shared_experts.down_proj.weight.zero_()
        ablated.model.layers[1].mlp.experts.down_proj[0] = 0
    assert row["kept"] == pytest.approx(_plain_prob(kept, tok, EX), rel=1e-4)
    assert row["ablated"] == pytest.approx(_plain_prob(ablated, tok, EX), rel=1e-4)
    # ranked expert scores: the dense layer's zero row is not a unit
    per = -torch.rand(2, E + 1) - 0.1
    res = faithfulness(model, per, EX, ablation="zero", ks=[E + 1], random_sets=2)
    assert res.table["fraction"].tolist() == [1.0]


def test_mean_ablation_of_dense_neurons_is_their_mean_over_every_token():
    model, plain, _ = _shared()
    items = encode(model, EX)
    ref = _references(model, items, "mean", None, None, max(len(it.ids) for it in items), 4)[0]
    mlp, acts = _dense_mlp(plain), []
    hook = mlp.register_forward_hook(lambda m, inp, out: acts.append(m.act_fn(m.gate_proj(inp[0])) * m.up_proj(inp[0])))
    with torch.no_grad():
        for it in items:
            plain(torch.tensor([it.ids]))
    hook.remove()
    first = torch.stack([a[0, 0] for a in acts]).double().mean(0)
    later = torch.cat([a[0, 1:] for a in acts]).double().mean(0)
    assert torch.allclose(ref[0, 0, :DENSE].double(), first, atol=1e-6)
    assert torch.allclose(ref[1, 0, :DENSE].double(), later, atol=1e-6)
    assert not bool(ref[:, 0, DENSE:].ne(0).any())


# ---- task 3: heatmaps


def _scores(model) -> NeuronScores:
    s = torch.rand(2, W, generator=torch.Generator().manual_seed(1)) + 0.5
    s[0, DENSE:] = 0
    return NeuronScores(s, meta=model_meta(model))


@pytest.mark.parametrize("abs_", [True, False])
def test_heatmap_leaves_padding_blank_and_draws_dividers_on_moe_layers_only(abs_):
    model = _shared()[0]
    scores = _scores(model)
    fig = neuron_heatmap(scores, abs=abs_)
    trace = fig.data[0]
    z, x = np.asarray(trace.z, dtype=float), np.asarray(trace.x)
    b = 2  # ceil(240 / 128), divides d_expert
    assert z.shape == (2, W // b)
    real = x < DENSE
    assert bool(np.isnan(z[0, ~real]).all()) and not bool(np.isnan(z[0, real]).any())
    assert not bool(np.isnan(z[1]).any())
    s = scores.scores
    assert np.allclose(z[0, real], s[0, :DENSE].reshape(-1, b).max(-1).values.numpy())
    assert all("padding" in t and "expert" not in t for t in np.asarray(trace.text)[0, ~real])
    assert not any("padding" in t or "expert" in t for t in np.asarray(trace.text)[0, real])
    assert all(t.startswith(("expert", "shared")) for t in np.asarray(trace.text)[1])
    lines = [sh for sh in fig.layout.shapes if sh.type == "line"]
    assert len(lines) == E and all((sh.y0, sh.y1) == (0.5, 1.5) for sh in lines)
    assert sorted(sh.x0 for sh in lines) == [e * DE - 0.5 for e in range(1, E + 1)]


def test_heatmap_of_a_set_and_a_block_ending_in_padding():
    model = _shared()[0]
    located = _neurons(model, [(0, 62), (1, 0)])
    fig = neuron_heatmap(located, bin_size=5)  # block 60-64 holds real 60-63 and padding 64
    trace = fig.data[0]
    z, text = np.asarray(trace.z, dtype=float), np.asarray(trace.text)
    assert z[0, 12] == 1 and text[0, 12] == "layer 0, neurons 60-63, 1 located: 62"
    assert bool(np.isnan(z[0, 13:]).all()) and "padding (layer 0 has 64 neurons)" in text[0, 13]
    assert z[1, 0] == 1 and not bool(np.isnan(z[1]).any())
    s = _scores(model)
    fig = neuron_heatmap(s, bin_size=5)
    assert float(fig.data[0].z[0][12]) == pytest.approx(float(s.scores[0, 60:64].max()))
    assert "at neuron" in fig.data[0].text[0][12] and int(fig.data[0].text[0][12].rsplit(" ", 1)[1]) < DENSE
