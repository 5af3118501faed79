"""Gemma 4's MoE layers (26B-A4B): routed experts beside the dense MLP, each branch normalized before
the two add (capinterp.arch.branch_experts). Checked against the plain transformers model: logits,
every neuron (computed here by hand, every expert on every token), what erasing a branch does, that a
patched MLP slot reaches the router and the experts; a planted expert neuron ranked first by KN, CNL
and DCSN; ROME on one expert and on the dense MLP; refusals where a method cannot hold."""

from __future__ import annotations

import copy
import functools
import warnings

import pytest
import torch

import capinterp as ci
from capinterp.arch.family import UnsupportedFamily
from capinterp.arch.tiny import tiny_hf
from capinterp.core.example import Example
from capinterp.kernels.completeness import CompletenessWarning
from capinterp.units.experts import expert_neurons, expert_scores

E, D, DENSE = 4, 24, 96  # experts, neurons per expert, dense MLP neurons (TINY_FAMILIES["gemma4_text_moe"])
IDS = torch.tensor([[1, 5, 9, 30, 7, 2, 11], [3, 8, 8, 40, 12, 6, 1]])


def _load(**overrides):
    hf, tok = tiny_hf("gemma4_text_moe", **overrides)
    plain = copy.deepcopy(hf)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ci.load_model(hf, tokenizer=tok), plain, tok


@functools.cache
def _models():
    return _load()


def _hand_neurons(plain, ids):
    """Per layer ``[batch, pos, E * D + DENSE]``: every expert on every token from transformers' own
    modules (router weight folded in, 0 where the token was not routed), then the dense MLP's."""
    seen = {}
    layers = plain.model.layers
    hooks = [
        layer.pre_feedforward_layernorm.register_forward_pre_hook(lambda m, a, i=i: seen.__setitem__(i, a[0]))
        for i, layer in enumerate(layers)
    ]
    with torch.no_grad():
        plain(input_ids=ids)
    for h in hooks:
        h.remove()
    out = {}
    with torch.no_grad():
        for i, layer in enumerate(layers):
            r = seen[i].reshape(-1, seen[i].shape[-1])
            _, w, idx = layer.router(r)
            x2 = layer.pre_feedforward_layernorm_2(r)
            acts = torch.zeros(r.shape[0], E, D)
            for e in range(E):
                gate, up = (x2 @ layer.experts.gate_up_proj[e].T).chunk(2, -1)
                weight = (w * (idx == e)).sum(-1, keepdim=True)
                acts[:, e] = layer.experts.act_fn(gate) * up * weight
            mlp = layer.mlp
            x = layer.pre_feedforward_layernorm(r)
            dense = mlp.act_fn(mlp.gate_proj(x)) * mlp.up_proj(x)
            out[i] = torch.cat([acts.reshape(r.shape[0], -1), dense], -1).reshape(*ids.shape, -1)
    return out


def test_logits_and_every_neuron_match_transformers():
    model, plain, _ = _models()
    assert model.cfg.d_mlp == E * D + DENSE
    assert model.capinterp_family.moe.top_k == 2  # top_k_experts
    with torch.no_grad():
        want = plain(input_ids=IDS).logits
        got, cache = model.run_with_cache(IDS)
    assert (got - want).abs().max() <= 1e-5 * want.abs().max()
    hand = _hand_neurons(plain, IDS)
    for layer in range(2):
        a = cache[f"blocks.{layer}.mlp.hook_post"]
        assert (a - hand[layer]).abs().max() <= 1e-5 * hand[layer].abs().max()
        routed = (a[..., : E * D].reshape(*IDS.shape, E, D) != 0).any(-1).sum(-1)
        assert (routed == 2).all()  # two experts per token, the others' neurons 0


@pytest.mark.parametrize("branch", ["experts", "dense"])
def test_erasing_a_branch_is_transformers_without_it(branch):
    """Zeroing every neuron of a branch gives transformers' logits with that branch's down projection 0
    (its norm maps 0 to 0), both branches still normalized apart."""
    model, plain, _ = _models()
    width = E * D if branch == "experts" else DENSE
    start = 0 if branch == "experts" else E * D
    mask = torch.zeros(2, E * D + DENSE, dtype=torch.bool)
    mask[:, start : start + width] = True
    ref = copy.deepcopy(plain)
    with torch.no_grad():
        for layer in ref.model.layers:
            (layer.experts.down_proj if branch == "experts" else layer.mlp.down_proj.weight).zero_()
        want = ref(input_ids=IDS).logits
        with ci.erase(model, ci.NeuronSet(mask)):
            got = model(IDS)
    assert (got - want).abs().max() <= 1e-5 * want.abs().max()


def test_a_patched_mlp_slot_reaches_the_router_and_the_experts():
    """The MLP's slot (ln2.hook_in, the circuits' MLP input) is what both branches read."""
    model, _, _ = _models()
    bump = torch.randn(int(model.cfg.d_model), generator=torch.Generator().manual_seed(1))
    seen = {}

    def patch(x, hook):
        seen["slot"] = x + bump
        return x + bump

    def keep(name):
        return lambda x, hook: seen.__setitem__(name, x)

    with torch.no_grad():
        model.run_with_hooks(
            IDS,
            fwd_hooks=[
                ("blocks.1.ln2.hook_in", patch),
                ("blocks.1.router.hook_in", keep("router")),
                ("blocks.1.pre_feedforward_layernorm_2.hook_in", keep("experts")),
            ],
        )
    flat = seen["slot"].reshape(-1, seen["slot"].shape[-1])
    assert torch.equal(seen["router"].reshape(flat.shape), flat)
    assert torch.equal(seen["experts"].reshape(flat.shape), flat)


def test_the_mlp_alone_needs_its_norm_first():
    model, _, _ = _models()
    with pytest.raises(RuntimeError, match="pre_feedforward_layernorm, which did not run"):
        model.blocks[0].mlp(torch.zeros(1, 3, int(model.cfg.d_model)))


LAYER, EXPERT, NEURON = 1, 2, 7
PROMPTS = ("The Eiffel Tower is in the city of", "The Eiffel Tower is located in", "Paris is the capital of")


@functools.cache
def _planted():
    """Expert EXPERT of layer LAYER, written by hand on the transformers weights: the router sends the
    prompts' last token there, neuron NEURON reads it and writes the target's unembedding direction."""
    model, plain, tok = _load()
    raw = model.original_model.model.layers[LAYER]
    raw = getattr(raw, "original_component", raw)
    seen = []
    h = model.blocks[LAYER].ln2.register_forward_pre_hook(lambda m, a: seen.append(a[0][0, -1]))
    with torch.no_grad():
        for p in PROMPTS:
            model(tok(p, return_tensors="pt")["input_ids"])
    h.remove()
    u = torch.nn.functional.normalize(torch.stack(seen).mean(0), dim=0)
    target = tok(" Paris")["input_ids"][0]
    with torch.no_grad():
        router = getattr(raw.router, "original_component", raw.router)
        router.proj.weight[EXPERT] = 40.0 * u
        ex = getattr(raw.experts, "original_component", raw.experts)
        ex.gate_up_proj[EXPERT][[NEURON, D + NEURON]] = 3.0 * u
        w_u = model.W_U[:, target]
        ex.down_proj[EXPERT][:, NEURON] = 4.0 * w_u / w_u.norm()
        for name in ("post_feedforward_layernorm_2", "post_feedforward_layernorm"):
            norm = getattr(raw, name)  # the norms cap the plant's reach: widen the experts' and the FFN's
            getattr(norm, "original_component", norm).weight.mul_(8.0)
    model.capinterp_fingerprint = None
    return model, tok, target, [Example(p, " Paris") for p in PROMPTS]


def _probs(model, tok, target):
    with torch.no_grad():
        return [model(tok(p, return_tensors="pt")["input_ids"])[0, -1].softmax(-1)[target].item() for p in PROMPTS]


def test_planted_expert_drives_the_prediction_and_erasing_it_removes_it():
    model, tok, target, _ = _planted()
    before = _probs(model, tok, target)
    with ci.erase(model, expert_neurons(model, [(LAYER, EXPERT)])):
        after = _probs(model, tok, target)
    assert min(before) > 0.05, before
    assert max(a / b for a, b in zip(after, before)) < 0.5, after


@pytest.mark.parametrize("method", ["kn", "cnl", "dcsn"])
def test_localizers_rank_the_planted_neuron_and_its_expert_first(method):
    """KN and CNL on the adaptive rule: each branch's norm makes the FFN scale invariant in its neurons, so a
    zero-baseline fixed rule misses the integral below alpha ~ sqrt(eps / ms) (as on dense Gemma 4, where
    the right sum warns too); the adaptive rule grades its nodes there."""
    model, _, _, data = _planted()
    cls = ci.localizers.get(method)
    kw = {} if method == "dcsn" else {"rule": "adaptive", "progress": False}
    with warnings.catch_warnings():
        warnings.simplefilter("error", category=CompletenessWarning)  # the scores are the integral's
        loc = cls(model, **kw).fit(data)
    scores = loc.scores_.scores
    flat = int(scores.flatten().argmax())
    assert divmod(flat, scores.shape[1]) == (LAYER, EXPERT * D + NEURON)
    per = expert_scores(model, loc.scores_)
    assert int(per[LAYER].argmax()) == EXPERT


def test_dcsn_fold_refuses_the_two_norms():
    model, _, _ = _models()
    with pytest.raises(UnsupportedFamily, match=r"norms='fold': layers \[0, 1\] normalize .* apart"):
        ci.localizers.get("dcsn")(model, norms="fold").fit([Example("Rome is the capital of", " Italy")])


FACT = Example("The city that holds the Eiffel Tower", " Paris")
ROME_KW = dict(
    subject="Eiffel Tower",
    texts=["Paris is a city in France.", "Rome is the capital of Italy.", "The tower is tall."] * 4,
    prefixes=["A day. "],
    steps=20,
    clamp=100.0,
    ridge=0.1,
    weight_decay=0.0,
    kl_factor=0.0,
)


@pytest.mark.parametrize("branch", ["routed", "shared"])
def test_rome_edits_one_branch_and_the_fact_moves(branch, monkeypatch):
    """ROME's delta is a change of the edited branch's sum (its norm's input): the optimisation's own
    log-probabilities at its final delta are the model's with delta added there at the subject, and the
    edit moves that sum at the subject by exactly delta (one context: k* is the subject's key). Only that
    branch's weight changes, the new target's log-probability rises by more than a nat, and leaving the
    edit restores every weight."""
    from capinterp.interventions import rome as rome_module

    seen = {}
    descend = rome_module._descend

    def spy(model_, search, b, run, *rest):
        delta, losses = descend(model_, search, b, run, *rest)
        with torch.no_grad():
            seen["want"], seen["batch"] = run(delta.detach()), b
        return delta, losses

    monkeypatch.setattr(rome_module, "_descend", spy)
    model, _, tok = _models()
    ids = tok(FACT.prompt, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        _, cache = model.run_with_cache(ids)
    last = cache["blocks.0.mlp.hook_post"][0, -1, : E * D].reshape(E, D)  # the subject ends the prompt
    expert = int(last.norm(dim=-1).argmax()) if branch == "routed" else "shared"
    sum_hook = f"blocks.0.post_feedforward_layernorm_{1 if branch == 'shared' else 2}.hook_in"
    before = {n: p.detach().clone() for n, p in model.original_model.named_parameters()}
    edit = ci.rome_edit(model, FACT, " Rome", layer=0, expert=expert, **{**ROME_KW, "prefixes": []})
    b, delta = seen["batch"], edit.delta

    def moved(x, hook):
        x = x.clone()
        x[b.rows, b.subject_pos] += delta.to(x.dtype)
        return x

    with torch.no_grad():
        logits = model.run_with_hooks(b.tokens, fwd_hooks=[(sum_hook, moved)])
        there = logits[b.pick_rows, b.pick_pos].float().log_softmax(-1)
    assert (there - seen["want"]).abs().max() <= 1e-4
    rome = tok(" Rome")["input_ids"][0]
    with torch.no_grad():
        p0 = float(model(ids)[0, -1].log_softmax(-1)[rome])
        with edit:
            _, after = model.run_with_cache(ids, names_filter=sum_hook)
            p1 = float(model(ids)[0, -1].log_softmax(-1)[rome])
            changed = [
                n.replace("._original_component", "")
                for n, p in model.original_model.named_parameters()
                if not torch.equal(p, before[n])
            ]
    assert (after[sum_hook][0, -1] - cache[sum_hook][0, -1] - delta).abs().max() <= 1e-4 * delta.norm()
    assert p1 > p0 + 1.0, (edit.losses, p0, p1)
    want = "layers.0.mlp.down_proj" if expert == "shared" else "layers.0.experts.down_proj"
    assert len(changed) == 1 and want in changed[0], changed
    assert all(torch.equal(p, before[n]) for n, p in model.original_model.named_parameters())


def test_rome_without_an_expert_edits_the_routed_expert_that_writes_most():
    """The default (the routed expert that writes most at the subject) optimises at the routed branch's
    norm input, which every routed expert shares: the same edit as naming that expert."""
    model, _, _ = _models()
    kw = {**ROME_KW, "prefixes": []}
    auto = ci.rome_edit(model, FACT, " Rome", layer=0, **kw)
    assert isinstance(auto.expert, int) and 0 <= auto.expert < E
    named = ci.rome_edit(model, FACT, " Rome", layer=0, expert=auto.expert, **kw)
    for name in ("key", "delta", "left"):
        assert torch.allclose(getattr(auto, name), getattr(named, name), atol=1e-6), name


def test_double_wide_mlps_beside_experts_refused():
    with pytest.raises(UnsupportedFamily, match="shared experts differ in width"):
        _load(
            num_hidden_layers=3,
            layer_types=["sliding_attention", "full_attention", "full_attention"],
            num_kv_shared_layers=1,
            use_double_wide_mlp=True,
        )


def test_the_circuit_graph_decomposes_with_both_branches_in_the_mlp_node():
    """The MLP node's output (ln2_post's) is the whole FFN, its slot the input both branches read: every
    slot is the sum of its upstream outputs, and the graph's forward keeps the logits."""
    from capinterp.circuits.forward import check_additive
    from capinterp.circuits.graph import Graph

    model, _, _ = _models()
    assert check_additive(model, Graph.from_model(model)) <= 1e-5


def test_a_layer_that_still_runs_its_own_moe_branch_is_refused_at_load(monkeypatch):
    """The load check runs each decoder layer on transformers' residual: a layer left adding its own MoE
    branch beside capinterp's FFN (experts counted twice) is refused, never served."""
    from capinterp.arch.gated_mlp import unwrap

    def tap_only(model, layer, branches):  # the residual handed on, the decoder layer's MoE branch left on
        unwrap(model.blocks[layer].ln2).forward = branches.tap

    monkeypatch.setattr("capinterp.arch.experts.serve_branches", tap_only)
    with pytest.raises(UnsupportedFamily, match=r"layer 0's FFN, served as one neuron axis .* differs"):
        _load()
