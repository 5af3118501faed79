"""Every consumer of the neuron space on a model whose layers mix dense and MoE FFNs (tiny DeepSeek-V2,
layer 0 dense with 64 neurons padded to the experts' 240): padding neurons are never drawn, ranked,
counted in a unit-space size or chance level, or accepted as neurons. References are written by hand
(plain transformers forwards, plain torch draws), never read off capinterp's output."""

from __future__ import annotations

import functools
import importlib
import math
import types
import warnings

import pytest
import torch
from moe_tiny import MIXED_DENSE, load_tiny_mixed

import capinterp as ci
from capinterp.core.tokens import encode
from capinterp.experiments import patching_agreement as PA
from capinterp.experiments.dcsn_common import sample_scores, top_fraction
from capinterp.experiments.forward_reasoning import activation_mask, activation_ratio
from capinterp.interventions.faithfulness import faithfulness
from capinterp.interventions.hooks import erase
from capinterp.plots.tokens import neuron_activations
from capinterp.units.neurons import NeuronScores, NeuronSet

FT = importlib.import_module("capinterp.interventions.finetune")  # the module (the package exports the function)
EX = [ci.Example("The Eiffel Tower is in the city of", " Paris"), ci.Example("Rome is the capital of", " Italy")]
DENSE = MIXED_DENSE  # the dense layer 0's neurons


@functools.cache
def _mixed():
    """The tiny mixed model (dense layer 0, MoE layer 1) and its plain transformers copy."""
    model, plain, _ = load_tiny_mixed()
    return model, plain


@functools.cache
def _kn() -> NeuronScores:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # IG completeness on a tiny random model
        return ci.localizers.get("kn")(_mixed()[0], progress=False).fit(EX).scores_


def _real() -> torch.Tensor:
    return ci.family_of(_mixed()[0]).valid_neurons()


def _n_real() -> int:
    return int(_real().sum())


# --- a hand-written zero ablation on the plain transformers model --------------------------------


def _masked_experts(experts, keep: torch.Tensor, d_expert: int):
    """DeepseekV2Experts.forward with each routed expert's neurons multiplied by ``keep``."""

    def forward(self, hidden, top_k_index, top_k_weights):
        out = torch.zeros_like(hidden)
        for e in range(self.num_experts):
            token, slot = torch.where(top_k_index == e)
            if token.numel() == 0:
                continue
            gate, up = torch.nn.functional.linear(hidden[token], self.gate_up_proj[e]).chunk(2, dim=-1)
            act = self.act_fn(gate) * up * keep[e * d_expert : (e + 1) * d_expert].to(hidden.dtype)
            y = torch.nn.functional.linear(act, self.down_proj[e]) * top_k_weights[token, slot, None]
            out.index_add_(0, token, y.to(out.dtype))
        return out

    return types.MethodType(forward, experts)


@torch.no_grad()
def _plain_prob(keep: torch.Tensor) -> float:
    """Mean p(first target token) over EX on plain transformers, the neurons outside ``keep``
    (bool [2, 240]) zeroed: dense layer 0 at its down projection's input, layer 1 per expert."""
    model, plain = _mixed()
    moe = ci.family_of(model).moe
    routed = moe.n_experts * moe.d_expert
    layer0, layer1 = plain.model.layers[0].mlp, plain.model.layers[1].mlp
    k0, k1 = keep[0, :DENSE].float(), keep[1].float()
    handles = [
        layer0.down_proj.register_forward_pre_hook(lambda m, a: (a[0] * k0.to(a[0].dtype),)),
        layer1.shared_experts.down_proj.register_forward_pre_hook(lambda m, a: (a[0] * k1[routed:].to(a[0].dtype),)),
    ]
    saved = layer1.experts.forward
    layer1.experts.forward = _masked_experts(layer1.experts, k1, moe.d_expert)
    try:
        probs = []
        for it in encode(model, EX):
            logits = plain(torch.tensor([it.prompt_ids])).logits[0, -1]
            probs.append(float(logits.float().softmax(-1)[it.target_ids[0]]))
    finally:
        layer1.experts.forward = saved
        for h in handles:
            h.remove()
    return sum(probs) / len(probs)


def test_the_plain_reference_matches_the_unablated_model():
    model, _ = _mixed()
    full = torch.ones(2, model.cfg.d_mlp, dtype=torch.bool)
    items = encode(model, EX)
    with torch.no_grad():
        want = []
        for it in items:
            logits = model(torch.tensor([it.prompt_ids]))[0, -1]
            want.append(float(logits.float().softmax(-1)[it.target_ids[0]]))
    assert _plain_prob(full) == pytest.approx(sum(want) / len(want), rel=1e-5)


# --- faithfulness -------------------------------------------------------------------------------


def test_faithfulness_counts_ranks_and_draws_real_neurons_only():
    model, _ = _mixed()
    scores, n, ks, draws, seed = _kn(), _n_real(), [7, 0.2], 3, 7
    res = faithfulness(model, scores, EX, ks=ks, ablation="zero", random_sets=draws, seed=seed, batch_size=8)
    sizes = [7, round(0.2 * n)]
    assert res.meta["n_units"] == n == DENSE + model.cfg.d_mlp
    assert res.meta["ks"] == sizes and list(res.table["fraction"]) == [k / n for k in sizes]
    # the located curve keeps the top-k real neurons by score (padding's exact 0 is no unit)
    real_flat = _real().flatten().nonzero().flatten()
    order = real_flat[torch.sort(scores.scores.flatten()[real_flat], descending=True, stable=True).indices]
    gen = torch.Generator().manual_seed(seed)
    for row, k in enumerate(sizes):
        top = torch.zeros(2 * model.cfg.d_mlp, dtype=torch.bool)
        top[order[:k]] = True
        assert res.table["kept"][row] == pytest.approx(_plain_prob(top.view(2, -1)), rel=1e-4, abs=1e-7)
        # the random band: draws over the real neurons, in the generator's order, padding running
        kept = []
        for _ in range(draws):
            pick = torch.ones(2 * model.cfg.d_mlp, dtype=torch.bool)
            pick[real_flat] = False
            pick[real_flat[torch.randperm(n, generator=gen)[:k]]] = True
            kept.append(_plain_prob(pick.view(2, -1)))
        assert res.table["random_kept_mean"][row] == pytest.approx(sum(kept) / draws, rel=1e-4, abs=1e-7)
    assert res.full == pytest.approx(_plain_prob(torch.ones(2, model.cfg.d_mlp, dtype=torch.bool)), rel=1e-4)


def test_faithfulness_refuses_a_bare_set_holding_padding():
    model, _ = _mixed()
    mask = torch.zeros(2, model.cfg.d_mlp, dtype=torch.bool)
    mask[0, DENSE + 3] = True
    with pytest.raises(ValueError, match="padding"):
        faithfulness(model, NeuronSet(mask), EX, random_sets=0)


# --- interventions ------------------------------------------------------------------------------


def test_erase_refuses_padding_neurons_of_a_bare_mask():
    model, _ = _mixed()
    mask = torch.zeros(2, model.cfg.d_mlp, dtype=torch.bool)
    mask[0, DENSE] = True
    with pytest.raises(ValueError, match="padding"), erase(model, NeuronSet(mask)):
        pass
    mask[0, DENSE] = False
    mask[0, DENSE - 1] = True
    with erase(model, NeuronSet(mask)):  # a real neuron of the dense layer is fine
        pass


def test_a_bare_mask_with_the_models_meta_draws_real_neurons_only():
    """The way out the padding refusal names: the model's meta gives a hand-made set its layer widths."""
    model, _ = _mixed()
    mask = torch.zeros(2, model.cfg.d_mlp, dtype=torch.bool)
    mask[0, :DENSE] = True  # every real neuron of the dense layer
    bare = NeuronSet(mask).random_like(seed=0, per_layer=True)
    assert bare.mask[0, DENSE:].any()  # without widths the draw reaches the padding ...
    with pytest.raises(ValueError, match=r"model_meta\(model\)"), erase(model, bare):
        pass
    drawn = NeuronSet(mask, meta=ci.model_meta(model)).random_like(seed=0, per_layer=True)
    assert torch.equal(drawn.mask, mask)  # ... with them, all 64 of 240 positions are the real ones
    with erase(model, drawn):
        pass


def test_finetune_random_arm_and_counts_use_real_neurons():
    model, _ = _mixed()
    mask = torch.zeros(2, model.cfg.d_mlp, dtype=torch.bool)
    mask[0, :5] = True
    bare = NeuronSet(mask)  # no layer widths: built from a mask by hand
    real = _real()
    for seed in range(40):
        rnd = FT._arm_neuron_sets(model, ["random"], bare, None, seed)["random"]
        assert len(rnd) == 5 and not bool((rnd.mask & ~real).any())
    # the same draw as a hand-written one over the real neurons
    pool = real.flatten().nonzero().flatten()
    want = torch.zeros(real.numel(), dtype=torch.bool)
    want[pool[torch.randperm(pool.numel(), generator=torch.Generator().manual_seed(3))[:5]]] = True
    assert torch.equal(FT._arm_neuron_sets(model, ["random"], bare, None, 3)["random"].mask.flatten(), want)
    counts = FT._neuron_counts(model, bare)
    assert counts["full"] == _n_real() and counts["without_located"] == _n_real() - 5


# --- experiments --------------------------------------------------------------------------------


def test_patching_agreement_draws_and_ranks_real_neurons(monkeypatch):
    model, _ = _mixed()
    seen: list[torch.Tensor] = []

    def fake_effects(model, data, src, groups, abl, partner, batch_size):  # the stair or the full forwards
        seen.extend(groups)
        return torch.zeros(len(groups)).numpy()

    monkeypatch.setattr(PA, "_effects", fake_effects)
    real = _real()
    pool = real.flatten().nonzero().flatten()
    zeros = NeuronScores(torch.zeros(2, model.cfg.d_mlp), _kn().meta)  # all ties: padding must not be picked
    for seed in range(10):
        seen.clear()
        PA.agreement_table(model, "t", EX, {"kn": _kn(), "zero": zeros}, n_top=40, n_random=40, seed=seed)
        singles = torch.stack(seen[:-2])  # then one group per layer
        assert not bool((singles & ~real).any())
        picked = set(singles.flatten(1).float().argmax(1).tolist())
        drawn = pool[torch.randperm(pool.numel(), generator=torch.Generator().manual_seed(seed))[:40]]
        assert set(drawn.tolist()) <= picked


def test_top_fraction_deviates_from_the_real_neurons_mean():
    # real scores 4, 15, 14, 14, 14, 14 (mean 12.5): 4 deviates most; with the two padding zeros the
    # mean would be 9.375 and 15 would deviate most
    s = torch.tensor([[4.0, 15.0, 0.0, 0.0], [14.0, 14.0, 14.0, 14.0]])
    meta = {"layer_widths": [2, 4]}
    n = NeuronSet.from_indices([(0, 0), (0, 1)], 2, 4, meta)
    assert set(top_fraction(NeuronScores(s, meta), n, 0.5)) == {(0, 0)}


def test_activation_mask_takes_statistics_over_real_neurons():
    real = torch.tensor([[True, True, False, False], [True, True, True, True]])
    scores = torch.tensor([[[1.0, 9.0, 0.0, 0.0], [2.0, 3.0, 2.5, 4.0]]])
    vals = scores[0][real].double()
    mean, std = vals.mean(), vals.std(correction=0)
    want = ((scores[0].double() - mean).abs() > 1.2 * std) & real
    got = activation_mask(scores, 1.2, real)[0]
    assert torch.equal(got, want) and bool(got.any())
    scores[0, 0, 2:] = -50.0  # whatever sits in the padding, it is never active nor counted
    assert torch.equal(activation_mask(scores, 1.2, real)[0], want)


def test_activation_ratio_chance_is_over_real_neurons():
    model, _ = _mixed()
    exs = [ci.Example(e.prompt, e.target, meta={"op_set": ["+"], "n_ops": 1}) for e in EX]
    ops = {"+": _kn().top_k(5)}
    table = activation_ratio(model, exs, ops, sigma=1.0, batch_size=8)
    real = _real()
    all_scores = torch.cat([s for _, s, _ in sample_scores(model, exs, 8)])
    for j in range(len(exs)):
        vals = all_scores[j].double()[real]
        dev = (all_scores[j].double() - vals.mean()).abs() > vals.std(correction=0)
        n_active = int((dev & real).sum())
        assert table["n_active"][j] == n_active and n_active > 0
        assert table["chance"][j] == pytest.approx(n_active / int(real.sum()))


# --- localizers and display ---------------------------------------------------------------------


def test_neft_top_k_is_bounded_by_the_real_neurons():
    model, _ = _mixed()
    n = _n_real()
    with pytest.raises(ValueError, match=rf"top_k must be in \[1, {n}\]"):
        ci.localizers.get("neft")(model, top_k=n + 1, progress=False).fit(EX)


def test_neuron_activations_refuse_padding():
    model, _ = _mixed()
    with pytest.raises(ValueError, match="padding"):
        neuron_activations(model, "Rome is", [(0, DENSE)])
    tokens, acts = neuron_activations(model, "Rome is", [(0, DENSE - 1), (1, 200)])
    assert acts.shape == (len(tokens), 2)


def test_cli_info_counts_real_neurons(monkeypatch, capsys):
    import json

    from capinterp.app import cli

    monkeypatch.setattr(cli, "_load", lambda args: _mixed()[0])
    assert cli.main(["info", "--model", "tiny", "--threads", "1"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["n_neurons"] == DENSE + 240 and info["layer_widths"] == [DENSE, 240]


def test_chance_levels_use_the_real_neuron_count():
    a, b = _kn().top_k(20), _kn().top_k(30, by="abs")
    n, inter = _n_real(), len(set(a) & set(b))
    # hypergeometric by hand: P(|A ∩ B| = k) = C(|B|, k) C(n - |B|, |A| - k) / C(n, |A|)
    p = [math.comb(30, k) * math.comb(n - 30, 20 - k) / math.comb(n, 20) for k in range(21)]
    c = ci.metrics.chance(a, b, "overlap")
    assert c.n_units == n and c.expected == pytest.approx(sum(pk * k / 20 for k, pk in enumerate(p)), rel=1e-9)
    assert c.p_value == pytest.approx(sum(p[inter:]), rel=1e-9)
    assert a.ratio == 20 / n


def test_attention_scaling_refuses_padding_neurons():
    from capinterp.interventions.attention_scaling import attention_scaling

    model, _ = _mixed()
    mask = torch.zeros(2, model.cfg.d_mlp, dtype=torch.bool)
    mask[0, DENSE + 1] = True
    with pytest.raises(ValueError, match="padding"):
        attention_scaling(model, EX[:1], keys="top", neurons=NeuronSet(mask))
    mask[0, DENSE + 1], mask[1, 5] = False, True
    assert len(attention_scaling(model, EX[:1], keys="top", neurons=NeuronSet(mask)))
