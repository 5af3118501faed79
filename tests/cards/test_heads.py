"""Head cards (capinterp/cards/heads.py, head_acts.py): the attention rows and the output-norm top
contexts against brute force on a separate plain transformers copy (Llama-shaped with grouped-query
attention, and GPT-2 with Conv1D), a planted previous-token head, describe() end to end on head
KeySets and head score arrays, the single-head ablation against a direct zeroing, and bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import capinterp as ci
from capinterp.arch.tiny import tiny_hf
from capinterp.cards import describe
from capinterp.cards._act_stream import encode_texts
from capinterp.cards.head_acts import attention_rows, head_norm_contexts
from capinterp.cards.heads import head_ablation_effects

TEXTS = ["The cat sat on the mat.", "1+2=3 and 4+5=9", "Rome is the capital of Italy.", "Paris is in France."]


def _pair(family: str, **overrides):
    """``(plain transformers copy (eager attention), the same model loaded through capinterp)``."""
    ref, _ = tiny_hf(family, **overrides)
    hf, tok = tiny_hf(family, **overrides)
    ref.config._attn_implementation = "eager"
    return ref, ci.load_model(hf, tokenizer=tok)


def _o_proj(ref, family: str, layer: int):
    return ref.transformer.h[layer].attn.c_proj if family == "gpt2" else ref.model.layers[layer].self_attn.o_proj


def _brute_norms(ref, family: str, ids: list[int], layer: int, head: int) -> torch.Tensor:
    """``[T]``: ``||z_h @ W_O[h]^T||`` at each position, from the output projection's input on the plain copy."""
    got = {}
    hook = _o_proj(ref, family, layer).register_forward_pre_hook(lambda m, a: got.setdefault("z", a[0].detach()))
    with torch.no_grad():
        ref(torch.tensor([ids]))
    hook.remove()
    w = _o_proj(ref, family, layer).weight.detach().float()  # Linear [d_model, H dh]; GPT-2's Conv1D [H dh, d_model]
    dh = (w.shape[0] if family == "gpt2" else w.shape[1]) // ref.config.num_attention_heads  # per layer (Gemma 4)
    z = got["z"][0, :, head * dh : (head + 1) * dh].float()
    w_o = w[head * dh : (head + 1) * dh] if family == "gpt2" else w[:, head * dh : (head + 1) * dh].T
    return (z @ w_o).norm(dim=-1)  # [T, d_model] -> [T]


@pytest.mark.parametrize("family", ["llama", "gpt2", "gemma3_text"])  # Gemma 3: a 4-token sliding window
def test_attention_rows_equal_transformers_output_attentions(family):
    ref, model = _pair(family)
    ids = encode_texts(model, TEXTS, None)
    heads = [(0, 0), (0, 1), (1, 2), (1, 3)]  # llama: heads 0/1 and 2/3 share a key/value group
    wanted = [(u, t, p) for u in heads for t in range(len(ids)) for p in (0, len(ids[t]) // 2, len(ids[t]) - 1)]
    rows = attention_rows(model, ids, wanted, batch_size=3)  # several texts per batch: right padding
    for t, seq in enumerate(ids):
        with torch.no_grad():
            att = ref(torch.tensor([seq]), output_attentions=True).attentions
        for (l, h), tt, p in wanted:
            if tt == t:
                want = att[l][0, h, p, : p + 1].float()
                assert torch.allclose(torch.tensor(rows[((l, h), t, p)]), want, atol=1e-5), ((l, h), t, p)
    last = len(ids[1]) - 1  # heads sharing keys and values keep their own rows
    assert not torch.allclose(torch.tensor(rows[((0, 0), 1, last)]), torch.tensor(rows[((0, 1), 1, last)]))


@pytest.mark.parametrize("family", ["llama", "gpt2", "gemma4_text"])  # Gemma 4: head widths differ by layer
def test_top_context_is_the_brute_force_argmax_of_the_head_output_norm(family):
    ref, model = _pair(family)
    ids = encode_texts(model, TEXTS, None)
    heads = [(1, 3), (0, 1), (1, 0)]
    found = head_norm_contexts(model, heads, TEXTS, k=2, batch_size=3, progress=False)
    for (l, h), acts in zip(heads, found):
        norms = [_brute_norms(ref, family, seq, l, h) for seq in ids]
        best = max(((float(n[p]), t, p) for t, n in enumerate(norms) for p in range(len(n))), key=lambda e: e[0])
        top = acts.contexts[0]
        assert (top.text_index, top.position) == (best[1], best[2])
        assert top.activation == pytest.approx(best[0], rel=1e-4)
        allv = torch.cat(norms)
        assert acts.stats.count == allv.numel() and acts.stats.mean == pytest.approx(float(allv.mean()), rel=1e-4)
        assert acts.stats.max == pytest.approx(float(allv.max()), rel=1e-4)


def _plant_previous_token_head(hf, head: int, theta: float = 2 * math.pi / 64, scale: float = 5000.0) -> None:
    """Layer 0's ``head`` of a tiny GPT-2 attends to the previous token: positions are angles ``theta * p``
    on two directions (orthogonal to each other and to the ones vector, so ln_1 only rescales them), the
    token embeddings nearly zero, keys the position and queries the position rotated back by one."""
    d, dh = hf.config.n_embd, hf.config.n_embd // hf.config.n_head
    g = torch.Generator().manual_seed(0)
    basis, _ = torch.linalg.qr(torch.cat([torch.ones(d, 1), torch.randn(d, 2, generator=g)], 1))
    u, w = basis[:, 1], basis[:, 2]
    p = torch.arange(hf.config.n_positions, dtype=torch.float32)[:, None]
    c, s = math.cos(theta), math.sin(theta)
    with torch.no_grad():
        hf.transformer.wpe.weight.copy_(10.0 * (torch.cos(theta * p) * u + torch.sin(theta * p) * w))
        hf.transformer.wte.weight.mul_(1e-7)
        ln, attn = hf.transformer.h[0].ln_1, hf.transformer.h[0].attn.c_attn
        ln.weight.fill_(1.0)
        ln.bias.zero_()
        q, k = slice(head * dh, (head + 1) * dh), slice(d + head * dh, d + (head + 1) * dh)
        attn.weight[:, q] = 0
        attn.weight[:, k] = 0
        attn.bias[q] = 0
        attn.bias[k] = 0
        gain = scale * math.sqrt(dh) / d  # LN(x) has norm sqrt(d): q . k / sqrt(dh) = scale cos(theta (p - 1 - p'))
        attn.weight[:, q.start] = gain * (c * u + s * w)
        attn.weight[:, q.start + 1] = gain * (-s * u + c * w)
        attn.weight[:, k.start] = u
        attn.weight[:, k.start + 1] = w


def test_a_planted_previous_token_head_puts_its_weight_on_the_previous_token():
    hf, tok = tiny_hf("gpt2")
    _plant_previous_token_head(hf, head=2)
    model = ci.load_model(hf, tokenizer=tok)
    cards = describe(model, ci.KeySet([(0, 2), (0, 1)], kind="head"), TEXTS, k=4, progress=False)
    other, planted = cards  # sorted by (layer, head)
    assert planted.unit == (0, 2) and len(planted.details["attention"]) == 4
    for ctx, strip in zip(planted.contexts, planted.details["attention"]):
        assert strip["position"] == ctx.position
        if ctx.position > 0:
            assert strip["top"][0]["position"] == ctx.position - 1 and strip["top"][0]["weight"] > 0.99
            assert strip["weights"][-2] > 0.99  # the strip ends at the destination, the source just before it
    assert any(ctx.position > 0 for ctx in planted.contexts)
    ids = encode_texts(model, TEXTS, None)  # every destination of every text; the unplanted head spreads out
    wanted = [(u, t, p) for u in [(0, 1), (0, 2)] for t in range(len(ids)) for p in range(1, len(ids[t]))]
    rows = attention_rows(model, ids, wanted)
    assert all(rows[((0, 2), t, p)][p - 1] > 0.99 for _, t, p in wanted)
    assert sum(rows[((0, 1), t, p)][p - 1] > 0.99 for _, t, p in wanted) < len(wanted) / 4


@pytest.fixture(scope="module")
def task():
    return ci.data.arithmetic(ops="+", n=6, seed=1)


def test_describe_a_head_keyset_end_to_end(tiny, task):
    heads = ci.KeySet([(2, 3), (0, 1), (3, 0)], kind="head")
    cards = describe(tiny, heads, TEXTS, task=task, k=3, progress=False)
    assert [c.unit for c in cards] == [(0, 1), (2, 3), (3, 0)] and cards.meta["unit_kind"] == "head"
    for c in cards:
        assert c.kind == "head" and c.label == f"L{c.unit[0]} H{c.unit[1]}" and len(c.contexts) == 3
        assert c.stats.count > 0 and c.task_stats.count > 0 and c.specificity is not None
        assert len(c.details["attention"]) == 3 and c.details["sources"]
        for ctx, strip in zip(c.contexts, c.details["attention"]):
            assert strip["position"] == ctx.position and sum(strip["weights"]) + strip["outside"] == pytest.approx(1)
            assert strip["tokens"][-1] == ctx.tokens[ctx.focus]
        top_ids = [s["id"] for s in c.details["sources"] if not s["special"]][:5]
        assert [t for _, t in c.effect.sources] == top_ids and len(c.effect.promoted) == 3
        assert set(c.ablation) == {"prob", "accuracy", "delta_prob", "delta_accuracy"}
    assert cards.meta["ablated"] == "the top 3 units, one at a time"
    page = cards.html()
    assert page.count("top source tokens") == 3 and "L0 H1" in page
    assert cards.to_dict()["cards"][0]["details"]["attention"][0]["weights"]


def test_head_scores_array_gives_the_top_heads_best_first(tiny):
    scores = np.full((4, 4), np.nan)  # a [n_layers, n_heads] array as head_patching returns, NaN skipped
    scores[1] = [0.1, 0.5, -0.2, 0.3]
    scores[3, 2] = 0.4
    cards = describe(tiny, scores, TEXTS, top=3, k=2, progress=False)
    assert [c.unit for c in cards] == [(1, 1), (3, 2), (1, 3)]
    assert [c.score for c in cards] == pytest.approx([0.5, 0.4, 0.3]) and cards.meta["units_in_input"] == 5
    assert all(c.ablation is None for c in cards)  # no task


def test_ablation_equals_zeroing_the_head_by_hand(tiny, task):
    from capinterp.kernels.evaluate import evaluate

    (got,) = head_ablation_effects(tiny, [(1, 2)], task)
    d = tiny.cfg.d_head

    def zero(x, hook):  # the output projection's input: zero head 2's slice
        x = x.clone()
        x.view(*x.shape[:2], -1)[..., 2 * d : 3 * d] = 0
        return x

    base = evaluate(tiny, task, progress=False)
    with tiny.hooks(fwd_hooks=[("blocks.1.attn.o.hook_in", zero)]):
        res = evaluate(tiny, task, progress=False)
    assert got["prob"] == pytest.approx(res.mean_prob) and got["delta_prob"] == pytest.approx(
        res.mean_prob - base.mean_prob
    )
    assert got["delta_prob"] != 0


@pytest.mark.parametrize(
    "units, match",
    [
        (ci.KeySet([], kind="head"), "empty"),
        (ci.KeySet([(0, 4)], kind="head"), r"head \(0, 4\) is out of range"),
        (ci.KeySet([(4, 0)], kind="head"), r"head \(4, 0\) is out of range"),
        (ci.KeySet([(0, -1)], kind="head"), "out of range"),
        (np.zeros((4, 5)), r"shape \(4, 4\)"),
        (np.full((4, 4), np.nan), "all NaN"),
    ],
)
def test_bad_heads_are_refused_before_any_forward(tiny, units, match):
    from capinterp.testing import ForwardCounter

    with ForwardCounter(tiny) as fc, pytest.raises(ValueError, match=match):
        describe(tiny, units, TEXTS, progress=False)
    assert fc.n == 0


def test_describe_cli_reads_a_saved_head_keyset(tmp_path, capsys):
    import json

    from capinterp.app.cli import main
    from capinterp.arch.model import load_model, model_meta

    ci.KeySet([(1, 2), (0, 3)], kind="head", meta=model_meta(load_model("tiny"))).save(tmp_path / "heads.json")
    (tmp_path / "t.txt").write_text("\n\n".join(TEXTS))
    argv = ["describe", "--model", "tiny", "--result", str(tmp_path / "heads.json"), "--texts", str(tmp_path / "t.txt")]
    assert main([*argv, "--k", "2", "--out", str(tmp_path / "o")]) == 0
    assert json.loads(capsys.readouterr().out)["units"] == ["L0 H3", "L1 H2"]
    cards = json.loads((tmp_path / "o" / "cards.json").read_text())["cards"]
    assert [c["kind"] for c in cards] == ["head", "head"] and len(cards[0]["details"]["attention"]) == 2
    assert "top source tokens" in (tmp_path / "o" / "cards.html").read_text(encoding="utf-8")


def test_normalized_values_leave_the_ov_effect_out_with_the_reason():
    hf, tok = tiny_hf("gemma4_text")  # v_norm, keys as values: no linear OV circuit; the rest is read
    cards = describe(ci.load_model(hf, tokenizer=tok), ci.KeySet([(1, 2)], "head"), TEXTS, k=2, progress=False)
    assert cards[0].effect is None and "gemma4_text" in cards[0].details["ov"] and len(cards[0].contexts) == 2
    assert "no OV effect" in cards.html()


def test_ablate_sets_how_many_heads_are_ablated(tiny, task):
    heads = ci.KeySet([(2, 3), (0, 1), (3, 0)], kind="head")
    none = describe(tiny, heads, TEXTS, task=task, k=2, ablate=0, progress=False)
    assert all(c.ablation is None for c in none) and none.meta["ablated"] == "none"
    one = describe(tiny, heads, TEXTS, task=task, k=2, ablate=1, progress=False)
    assert one[0].ablation is not None and [c.ablation for c in one[1:]] == [None, None]
    assert one.meta["ablated"] == "the top 1 units, one at a time"
