"""ROME causal tracing on the tiny random Llama: exactness, batching vs a slow loop, errors, units, plot."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from capinterp.arch.model import load_model
from capinterp.core.example import Example
from capinterp.core.tokens import TokenizationError, encode, model_bos
from capinterp.localizers import get
from capinterp.localizers.causal_trace import TOKEN_GROUPS, CausalTrace, subject_token_range
from capinterp.units.base import KeySet

PROMPTS = [
    ("The Eiffel Tower is in the city of", "Eiffel Tower"),
    ("Rome is the capital of", "Rome"),
    ("Berlin is the capital of", "Berlin"),
    ("The mother tongue of Tokyo is", "Tokyo"),
]


@pytest.fixture(scope="module")
def model():
    return load_model("tiny", threads=1)


def _prompt_ids(model, prompt: str) -> list[int]:
    return model_bos(model) + model.tokenizer(prompt, add_special_tokens=False)["input_ids"]


def _greedy(model, prompt: str) -> int:
    ids = _prompt_ids(model, prompt)
    with torch.no_grad():
        return int(model(torch.tensor([ids]))[0, -1].argmax())


@pytest.fixture(scope="module")
def facts(model):
    """Facts whose target IS the random model's greedy answer (so none is skipped)."""
    out = []
    for prompt, subject in PROMPTS:
        o = _greedy(model, prompt)
        ex = Example(prompt, model.tokenizer.decode([o]), {"subject": subject, "target_from": "greedy"})
        try:
            enc = encode(model, [ex], max_target_tokens=1)[0]
        except TokenizationError:
            continue
        if enc.target_ids[0] == o:
            out.append(ex)
    assert len(out) >= 2, "need at least two usable greedy facts for the tiny model"
    return out


@pytest.fixture(scope="module")
def traced(model, facts):
    return CausalTrace(model, samples=3, window=3, top_k=2, progress=False).fit(facts)


# ------------------------------------------------------------------------------ slow reference


def _slow_grid(model, ex: Example, kind: str, window: int, samples: int, noise_std: float, seed: int = 1):
    """ROME's loop, one restoration at a time with plain hooks over full sequences."""
    tok = model.tokenizer
    ids = torch.tensor([_prompt_ids(model, ex.prompt)])
    T, L = ids.shape[1], model.cfg.n_layers
    nb = len(model_bos(model))
    s0, s1 = subject_token_range(tok, ex.prompt, ex.meta["subject"], ids[0, nb:].tolist(), offset=nb)
    name = {"resid": "hook_resid_post", "mlp": "hook_mlp_out", "attn": "hook_attn_out"}[kind]
    clean = {}

    def keep(l):
        def f(act, hook):
            clean[l] = act[0].clone()

        return f

    with torch.no_grad():
        logits = model.run_with_hooks(ids, fwd_hooks=[(f"blocks.{l}.{name}", keep(l)) for l in range(L)])
    o = int(logits[0, -1].argmax())
    gen = torch.Generator().manual_seed(seed)
    eps = torch.randn(samples, s1 - s0, model.cfg.d_model, generator=gen) * noise_std

    def corrupt(act, hook):
        act = act.clone()
        act[:, s0:s1] += eps
        return act

    def p_of(extra):
        with torch.no_grad():
            out = model.run_with_hooks(ids.expand(samples, -1), fwd_hooks=[("hook_embed", corrupt), *extra])
        return float(out[:, -1].softmax(-1)[:, o].mean())

    p_star = p_of([])
    grid = torch.zeros(T, L)
    for t in range(T):
        for l in range(L):
            layers = [l] if kind == "resid" else range(max(0, l - window // 2), min(L, l - (-window // 2)))

            def patch(j, t=t):
                def f(act, hook):
                    act = act.clone()
                    act[:, t] = clean[j][t]
                    return act

                return f

            grid[t, l] = p_of([(f"blocks.{j}.{name}", patch(j)) for j in layers]) - p_star
    return grid, p_star, float(logits[0, -1].softmax(-1)[o])


@pytest.mark.parametrize("reuse_prefix,batch_size", [(True, 7), (False, 7), (True, 1000)])
def test_batched_grids_equal_slow_loop(model, facts, reuse_prefix, batch_size):
    tr = CausalTrace(model, samples=3, window=3, reuse_prefix=reuse_prefix, batch_size=batch_size, progress=False).fit(
        facts[:1]
    )
    rec = tr.per_prompt_[0]
    for kind in ("resid", "mlp", "attn"):
        ref, p_star, p_clean = _slow_grid(model, facts[0], kind, 3, 3, tr.noise_std_)
        assert rec["p_corrupt"] == pytest.approx(p_star, abs=1e-6)
        assert rec["p_clean"] == pytest.approx(p_clean, abs=1e-6)
        torch.testing.assert_close(rec["grids"][kind], ref, atol=1e-5, rtol=0)


def test_restoring_last_resid_recovers_clean_probability(traced):
    for rec in traced.per_prompt_:
        g = rec["grids"]["resid"]
        # the last layer's block output at the last token fixes the logits: full recovery
        assert rec["p_corrupt"] + g[-1, -1] == pytest.approx(rec["p_clean"], abs=1e-5)
        assert rec["probs"]["resid"][-1, -1] == pytest.approx(rec["p_clean"], abs=1e-5)
        # the last layer at an earlier token cannot reach the output
        assert g[:-1, -1].abs().max() < 1e-6
        # states before the subject are never corrupted
        s0, _ = rec["subject_range"]
        assert torch.all(g[:s0] == 0)


def test_restoring_every_clean_state_recovers_clean(model, facts):
    """Restoring layer 0's clean block output at every token removes the corruption entirely."""
    from capinterp.localizers.causal_trace import _Runner

    tr = CausalTrace(model, samples=3, kinds=("resid",), progress=False).fit(facts[:1])
    rec = tr.per_prompt_[0]
    item = tr._prepare(0, facts[0])
    ids = torch.tensor([item["ids"]])
    clean = {}

    def keep(act, hook):
        clean[("resid", 0)] = act[0].clone()

    with torch.no_grad():
        model.run_with_hooks(ids, fwd_hooks=[("blocks.0.hook_resid_post", keep)])
        run = _Runner(
            tr,
            ids,
            tr._noise(item["subject_range"][1] - item["subject_range"][0]),
            item["subject_range"],
            clean,
            rec["answer_id"],
        )
        T, S = ids.shape[1], tr.samples
        # one row per noise sample; each row restores layer 0 at every token
        spec = [
            ("blocks.0.hook_resid_post", "resid", 0, torch.arange(S).repeat_interleave(T), torch.arange(T).repeat(S))
        ]
        p = run.rows(torch.arange(S), spec, 0, None)
    assert float(p.mean()) == pytest.approx(rec["p_clean"], abs=1e-5)
    assert rec["p_corrupt"] < rec["p_clean"] - 1e-4 or rec["p_corrupt"] > rec["p_clean"] + 1e-4  # noise mattered


def test_zero_noise_gives_zero_effects(model, facts):
    tr = CausalTrace(model, noise_std=0.0, samples=2, window=3, progress=False).fit(facts)
    assert tr.noise_std_ == 0.0
    for rec in tr.per_prompt_:
        assert rec["p_corrupt"] == pytest.approx(rec["p_clean"], abs=1e-6)
        for g in rec["grids"].values():
            assert g.abs().max() < 1e-6
    tr0 = CausalTrace(model, noise=0.0, samples=2, kinds=("mlp",), progress=False).fit(facts[:1])
    assert tr0.noise_std_ == 0.0 and tr0.per_prompt_[0]["grids"]["mlp"].abs().max() < 1e-6


def test_noise_is_three_std_of_subject_embeddings(model, facts, traced):
    embs = []
    for ex in facts:
        tok = model.tokenizer
        ids = _prompt_ids(model, ex.prompt)
        nb = len(model_bos(model))
        s0, s1 = subject_token_range(tok, ex.prompt, ex.meta["subject"], ids[nb:], offset=nb)
        _, cache = model.run_with_cache(torch.tensor([ids]), names_filter=lambda n: n == "hook_embed")
        embs.append(cache["hook_embed"][0, s0:s1].reshape(-1))
    assert traced.noise_std_ == pytest.approx(3.0 * float(torch.cat(embs).std()), rel=1e-5)
    s3 = CausalTrace(model, noise="s3", samples=2, kinds=("mlp",), progress=False).fit(facts[:1])
    one = CausalTrace(model, noise=3.0, samples=2, kinds=("mlp",), progress=False).fit(facts[:1])
    assert s3.noise_std_ == one.noise_std_
    lit = CausalTrace(model, noise_std=0.25, samples=2, kinds=("mlp",), progress=False).fit(facts[:1])
    assert lit.noise_std_ == 0.25


def test_same_seed_same_result_different_seed_differs(model, facts):
    kw = dict(samples=2, kinds=("mlp",), window=3, progress=False)
    a = CausalTrace(model, seed=1, **kw).fit(facts[:1]).per_prompt_[0]
    b = CausalTrace(model, seed=1, **kw).fit(facts[:1]).per_prompt_[0]
    c = CausalTrace(model, seed=2, **kw).fit(facts[:1]).per_prompt_[0]
    assert torch.equal(a["grids"]["mlp"], b["grids"]["mlp"])
    assert a["p_corrupt"] != c["p_corrupt"]


def test_skipped_prompts_are_counted(model, facts):
    wrong = Example(facts[0].prompt, " Paris" if facts[0].target != " Paris" else " Rome", dict(facts[0].meta))
    tr = CausalTrace(model, samples=2, kinds=("mlp",), progress=False).fit([wrong, *facts[1:]])
    assert tr.skipped_ == 1 and tr.n_traced_ == len(facts) - 1
    assert tr.skipped_facts_[0]["index"] == 0 and tr.skipped_facts_[0]["target"] == wrong.target
    assert [r["index"] for r in tr.per_prompt_] == list(range(1, len(facts)))
    with pytest.raises(ValueError, match="no fact could be traced"):
        CausalTrace(model, samples=2, kinds=("mlp",), progress=False).fit([wrong])
    kept = CausalTrace(model, samples=2, kinds=("mlp",), require_correct=False, progress=False).fit([wrong])
    assert kept.skipped_ == 0 and kept.n_traced_ == 1


def test_errors(model, facts):
    with pytest.raises(ValueError, match="empty"):
        CausalTrace(model, progress=False).fit([])
    with pytest.raises(ValueError, match="not found"):
        CausalTrace(model, progress=False).fit([Example("Rome is the capital of", " Italy", {"subject": "Paris"})])
    with pytest.raises(ValueError, match="subject"):
        CausalTrace(model, progress=False).fit([Example("Rome is the capital of", " Italy", {})])
    with pytest.raises(TokenizationError):  # a BPE merge crosses the prompt/target boundary
        CausalTrace(model, progress=False).fit([Example("Rome is the cap", "ital", {"subject": "Rome"})])
    with pytest.raises(ValueError, match="kinds"):
        CausalTrace(model, kinds=("mlp", "bogus"))
    with pytest.raises(ValueError, match="layer_kind"):
        CausalTrace(model, kinds=("attn",), layer_kind="mlp")
    assert CausalTrace(model, kinds=("attn", "resid")).layer_kind == "attn"
    with pytest.raises(ValueError, match="top_k"):  # at most n_layers: the model is read in fit
        CausalTrace(model, top_k=99, progress=False).fit(
            [Example("Rome is the capital of", " Italy", {"subject": "Rome"})]
        )
    with pytest.raises(ValueError, match="top_k"):
        CausalTrace(model, top_k=0)
    with pytest.raises(ValueError, match="token"):
        CausalTrace(model, token="middle")
    with pytest.raises(ValueError, match="noise"):
        CausalTrace(model, noise="m")
    with pytest.raises(RuntimeError, match="not fitted"):
        CausalTrace(model).top_layers()


def test_subject_token_range(model):
    tok = model.tokenizer
    prompt = "The Eiffel Tower is in the city of"
    ids = tok(prompt, add_special_tokens=False)["input_ids"]
    s0, s1 = subject_token_range(tok, prompt, "Eiffel Tower", ids)
    assert tok.decode(ids[s0:s1]).strip() == "Eiffel Tower"
    assert subject_token_range(tok, prompt, "Eiffel Tower", ids, offset=1) == (s0 + 1, s1 + 1)


def test_units_layers_and_scores(model, traced):
    L = model.cfg.n_layers
    assert isinstance(traced.units_, KeySet)
    assert traced.units_.kind == "layer" and traced.units_.space == ("layer", L)
    assert len(traced.units_) == traced.top_k == 2 and set(traced.units_) == set(traced.layers_)
    mlp_params = sum(p.numel() for p in model.blocks[0].mlp.parameters())
    total = sum(p.numel() for p in model.parameters())
    assert traced.units_.param_share == pytest.approx(2 * mlp_params / total)
    scores = traced.layer_scores_
    assert scores.shape == (L,)
    assert traced.layers_ == sorted(range(L), key=lambda l: -float(scores[l]))[:2]
    # the ranking row is the averaged grid's last-subject row
    torch.testing.assert_close(scores, traced.grids_["mlp"][TOKEN_GROUPS.index("last_subject")])
    assert traced.top_layers(1) == traced.layers_[:1]
    any_scores = traced.layer_scores("mlp", "any")
    expect = torch.stack([r["grids"]["mlp"].max(0).values for r in traced.per_prompt_]).mean(0)
    torch.testing.assert_close(any_scores, expect)
    assert len(traced.top_layers(3, kind="attn", token="last")) == 3
    assert get("causal_trace") is CausalTrace


def test_grouped_average(traced):
    assert set(traced.grids_) == {"resid", "mlp", "attn"}
    g = traced.grids_["mlp"]
    assert g.shape == (len(TOKEN_GROUPS), traced.model.cfg.n_layers)
    last_subj = torch.stack([r["grids"]["mlp"][r["subject_range"][1] - 1] for r in traced.per_prompt_]).mean(0)
    torch.testing.assert_close(g[TOKEN_GROUPS.index("last_subject")], last_subj)
    last = torch.stack([r["grids"]["mlp"][-1] for r in traced.per_prompt_]).mean(0)
    torch.testing.assert_close(g[TOKEN_GROUPS.index("last")], last)


def test_plot_z_equals_grid(traced):
    fig = traced.plot("mlp", prompt=0)
    rec = traced.per_prompt_[0]
    np.testing.assert_allclose(np.asarray(fig.data[0].z, dtype=float), rec["grids"]["mlp"].numpy())
    labels = list(fig.layout.yaxis.ticktext)
    s0, s1 = rec["subject_range"]
    assert len(labels) == len(rec["tokens"])
    assert all(lab.endswith("*") == (s0 <= i < s1) for i, lab in enumerate(labels))
    avg = traced.plot("attn")
    np.testing.assert_allclose(np.asarray(avg.data[0].z, dtype=float), traced.grids_["attn"].numpy())
    assert "IE" in avg.data[0].text[0][0]
    with pytest.raises(ValueError):
        traced.plot("bogus")


def test_native_model_without_kv_cache_falls_back(facts):
    """TL-native models return no HF cache: the full-sequence path runs and agrees with itself."""
    m = load_model("tiny-native", threads=1)
    prompt, subject = PROMPTS[1]
    ex = Example(prompt, m.tokenizer.decode([_greedy(m, prompt)]), {"subject": subject, "target_from": "greedy"})
    kw = dict(samples=2, window=1, top_k=1, progress=False, require_correct=False)
    a = CausalTrace(m, **kw).fit([ex])
    b = CausalTrace(m, reuse_prefix=False, **kw).fit([ex])
    for k in a.kinds:
        torch.testing.assert_close(a.per_prompt_[0]["grids"][k], b.per_prompt_[0]["grids"][k], atol=1e-6, rtol=0)


@pytest.mark.slow
def test_smollm2_traces_builtin_facts(smollm2):
    from capinterp.data.facts import builtin_facts, facts_known_by

    m = smollm2  # the session's copy: no second load
    known = facts_known_by(m, builtin_facts())
    assert len(known) >= 2
    shortest = sorted(known, key=lambda f: len(f.prompt))[:2]  # the grid's cost grows with the prompt
    tr = CausalTrace(m, kinds=("mlp",), samples=3, progress=False).fit(shortest)
    assert tr.grids_["mlp"].shape == (len(TOKEN_GROUPS), m.cfg.n_layers)
    for rec in tr.per_prompt_:
        assert rec["grids"]["mlp"].shape == (len(rec["tokens"]), m.cfg.n_layers)
        assert rec["p_clean"] - rec["p_corrupt"] > 0
    assert len(tr.units_) == 3
