"""Expert cards (capinterp.cards.experts): routing read from the served MoE blocks equals what the plain
transformers router chooses, and describe() on an expert KeySet gives complete, consistent cards."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from moe_tiny import load_tiny_moe, moe_block

import capinterp as ci
from capinterp.cards._act_stream import encode_texts
from capinterp.cards._routing import expert_routing
from capinterp.units.base import KeySet

TEXTS = [
    "The Eiffel Tower is in the city of Paris.",
    "1+2=3 and 4+5=9",
    "Rome is the capital of Italy. Berlin is the capital of Germany.",
    "write Python code for compute 7*8",
    "Tokyo",
]


def _reference(plain, ids, n_layers, n_experts):
    """Per (layer, expert): routed tokens and their summed router weight, and routed counts per token id,
    from forward hooks on the plain transformers routers, one unpadded text at a time; and the shared
    expert's sigmoid gates where the block has one."""
    seen: dict[int, list] = {layer: [] for layer in range(n_layers)}
    gates: list[torch.Tensor] = []
    handles = []
    for layer in range(n_layers):
        block = moe_block(plain, layer)
        router = getattr(block, "router", None) or block.gate
        handles.append(router.register_forward_hook(lambda m, i, o, layer=layer: seen[layer].append(o)))
        if layer == n_layers - 1 and getattr(block, "shared_expert_gate", None) is not None:
            handles.append(block.shared_expert_gate.register_forward_hook(lambda m, i, o: gates.append(o)))
    with torch.no_grad():
        for seq in ids:
            plain(torch.tensor([seq]))
    for h in handles:
        h.remove()
    routed, weight, per_token = Counter(), Counter(), Counter()
    for layer in range(n_layers):
        for seq, out in zip(ids, seen[layer]):
            weights, index = out[1].reshape(len(seq), -1), out[-1].reshape(len(seq), -1)
            for t, row, wrow in zip(seq, index.tolist(), weights.tolist()):
                for e, w in zip(row, wrow):
                    routed[layer, e] += 1
                    weight[layer, e] += w
                    per_token[layer, e, t] += 1
    shared = torch.sigmoid(torch.cat([g.reshape(-1) for g in gates])) if gates else None
    return routed, weight, per_token, shared


@pytest.mark.parametrize("family", ["mixtral", "qwen2_moe", "olmoe"])
def test_routing_counts_equal_the_transformers_router(family):
    model, plain, _, _ = load_tiny_moe(family)
    n_layers, n_experts = int(model.cfg.n_layers), ci.units.experts.moe_of(model).n_experts
    keys = [(layer, e) for layer in range(n_layers) for e in range(n_experts)]
    shared = family == "qwen2_moe"
    if shared:
        keys.append((n_layers - 1, "shared"))
    found = expert_routing(model, keys, TEXTS, k=3, batch_size=2, progress=False)
    ids = encode_texts(model, TEXTS, None)
    routed, weight, per_token, gates = _reference(plain, ids, n_layers, n_experts)
    n_tokens = sum(len(s) for s in ids)
    assert sum(routed.values()) == n_layers * 2 * n_tokens  # top 2 of each token, in each layer
    for r in found[: len(keys) - shared]:
        layer, e = r.unit
        assert r.tokens == n_tokens
        assert r.routed == routed[layer, e], (r.unit, r.routed, routed[layer, e])
        assert r.weight_sum == pytest.approx(weight[layer, e], rel=1e-4, abs=1e-5)
        assert {t: int(c) for t, c in enumerate(r.by_token.tolist()) if c} == {
            t: c for (la, ex, t), c in per_token.items() if (la, ex) == (layer, e)
        }
        top = r.acts.contexts[0]  # the highest routing weight: the max the router gave this expert
        assert r.acts.stats.max == pytest.approx(top.activation)
        assert r.acts.stats.mean == pytest.approx(weight[layer, e] / n_tokens, rel=1e-4, abs=1e-6)
    if shared:
        s = found[-1]
        assert s.routed == s.tokens == n_tokens
        assert s.weight_sum == pytest.approx(float(gates.sum()), rel=1e-4)


@pytest.fixture(scope="module")
def qwen_moe():
    return load_tiny_moe("qwen2_moe")[0]


def test_describe_an_expert_keyset(qwen_moe):
    model = qwen_moe
    units = KeySet([(1, 3), (0, 1), (1, "shared")], "expert")
    task = ci.data.arithmetic(ops="+", n=4)
    cards = ci.describe(model, units, TEXTS, task=task, k=3, progress=False)
    assert [c.label for c in cards] == ["L0 E1", "L1 E3", "L1 Eshared"]
    assert cards.meta["unit_kind"] == "expert" and cards.meta["ablated"] == "the top 3 units, one at a time"
    expected = ci.cards.logit_effect.expert_logit_effects(model, [(0, 1), (1, 3)], k=3)
    for card, effect in zip(cards[:2], expected):
        assert card.kind == "expert" and card.promoted == [str(t) for t, _, _ in effect.promoted]
        r = card.details["routing"]
        assert 0 < r["routed"] <= r["tokens"] and r["frequency"] == r["routed"] / r["tokens"]
        assert r["uniform_frequency"] == 0.5  # top 2 of 4 experts
        counts = [c for _, c, _ in card.details["by_count"]]
        assert counts == sorted(counts, reverse=True) and sum(counts) <= r["routed"]
        assert all(c.values[c.focus] == c.activation > 0 for c in card.contexts)
        task_d = card.details["task"]
        assert task_d["ratio"] == pytest.approx(task_d["frequency"] / r["frequency"])
        assert set(card.ablation) == {"prob", "accuracy", "delta_prob", "delta_accuracy"}
    assert cards[2].effect is None and cards[2].details["routing"]["frequency"] == 1.0
    page = cards.html()
    assert "most routed tokens (count)" in page and "highest routing rate" in page
    assert cards.to_dict()["cards"][0]["details"]["routing"]["routed"] == cards[0].details["routing"]["routed"]


def test_ablating_an_expert_changes_the_task_like_erase(qwen_moe):
    """The card's ablation is the task evaluated with the expert's neurons erased."""
    model = qwen_moe
    task = ci.data.arithmetic(ops="+", n=3)
    card = ci.describe(model, KeySet([(0, 2)], "expert"), TEXTS, task=task, k=2, progress=False)[0]
    with ci.erase(model, ci.units.experts.expert_neurons(model, [(0, 2)])):
        res = ci.evaluate(model, task, progress=False)
    assert card.ablation["prob"] == pytest.approx(res.mean_prob)


def test_bad_expert_sets_are_refused_before_any_forward(qwen_moe, tiny):
    with pytest.raises(ValueError, match="empty"):
        ci.describe(qwen_moe, KeySet([], "expert"), TEXTS, progress=False)
    with pytest.raises(ValueError, match=r"expert 9 is not one of 0\.\.3"):
        ci.describe(qwen_moe, KeySet([(0, 9)], "expert"), TEXTS, progress=False)
    with pytest.raises(ValueError, match="layer 5 out of range"):
        ci.describe(qwen_moe, KeySet([(5, 0)], "expert"), TEXTS, progress=False)
    with pytest.raises(ValueError, match="dense FFNs"):
        ci.describe(tiny, KeySet([(0, 0)], "expert"), TEXTS, progress=False)


@pytest.mark.parametrize("family", ["llama4_text", "jetmoe", "deepseek_v4"])
def test_routing_matches_the_experts_neurons_on_other_routers(family):
    """Routers that return scores over all experts (Llama 4), choices grouped by expert (JetMoE) or
    route by token id (DeepSeek-V4's hash layer): a token counts as routed to an expert exactly where
    that expert's neurons are not all zero, and each token is routed to top_k experts per layer."""
    model = load_tiny_moe(family)[0]
    moe = ci.units.experts.moe_of(model)
    keys = [(layer, e) for layer in range(int(model.cfg.n_layers)) for e in range(moe.n_experts)]
    found = expert_routing(model, keys, TEXTS, k=2, batch_size=3, progress=False)
    expected: Counter = Counter()
    for seq in encode_texts(model, TEXTS, None):
        _, cache = model.run_with_cache(torch.tensor([seq]), names_filter=lambda n: n.endswith("mlp.hook_post"))
        for layer in range(int(model.cfg.n_layers)):
            acts = cache[f"blocks.{layer}.mlp.hook_post"][0, :, : moe.n_experts * moe.d_expert]
            hit = acts.reshape(len(seq), moe.n_experts, moe.d_expert).ne(0).any(-1).sum(0)
            for e in range(moe.n_experts):
                expected[layer, e] += int(hit[e])
    assert {r.unit: r.routed for r in found} == {u: expected[u] for u in keys}
    assert sum(r.routed for r in found) == int(model.cfg.n_layers) * 2 * found[0].tokens


def test_a_mixed_models_dense_layer_has_no_expert_cards():
    """glm4_moe as released: layer 0 dense, layer 1 MoE; an expert of layer 1 gets a card, one of layer 0 is refused."""
    import warnings

    from capinterp.arch.tiny import tiny_hf

    hf, tok = tiny_hf("glm4_moe")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = ci.load_model(hf, tokenizer=tok)
    assert ci.units.experts.dense_layers(model) == [0]
    with pytest.raises(ValueError, match="layer 0 is a dense layer"):
        ci.describe(model, KeySet([(0, 1), (1, 1)], "expert"), TEXTS, progress=False)
    (card,) = ci.describe(model, KeySet([(1, 1)], "expert"), TEXTS, k=2, progress=False)
    assert card.label == "L1 E1" and 0 < card.details["routing"]["routed"] < card.details["routing"]["tokens"]


def test_ablate_sets_how_many_experts_are_ablated(qwen_moe):
    units = KeySet([(1, 3), (0, 1)], "expert")
    task = ci.data.arithmetic(ops="+", n=4)
    none = ci.describe(qwen_moe, units, TEXTS, task=task, k=2, ablate=0, progress=False)
    assert all(c.ablation is None for c in none) and none.meta["ablated"] == "none"
    one = ci.describe(qwen_moe, units, TEXTS, task=task, k=2, ablate=1, progress=False)
    assert one[0].ablation is not None and one[1].ablation is None
