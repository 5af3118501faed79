"""Query Localization: consistency scores, classes, CAS neurons, attention scaling, bad input."""

import numpy as np
import plotly.graph_objects as go
import pytest
import torch
from fact_planting import FACT_A, FACT_B, NEURONS_A, NEURONS_B, plant_facts

import capinterp as ci
from capinterp.data import Example
from capinterp.interventions.attention_scaling import attention_scaling, knowledge_synapses, scale_attention
from capinterp.interventions.edit_eval import prompt_ids
from capinterp.localizers.kn import KN
from capinterp.localizers.query_localization import QueryLocalization, consistency_aware_scores
from capinterp.units.neurons import NeuronSet


@pytest.fixture(scope="module")
def planted():
    m = ci.load_model("tiny")
    plant_facts(m)
    return m


def _scores(tiny, sets_per_fact):
    """Per-fact [n, L, d] score maps whose coarse sets are exactly the given neuron sets."""
    L, d = tiny.cfg.n_layers, tiny.cfg.d_mlp
    out = []
    for sets in sets_per_fact:
        s = torch.zeros(len(sets), L, d)
        for q, neurons in enumerate(sets):
            for l, i in neurons:
                s[q, l, i] = 1.0
        out.append(s)
    return out


def test_identical_queries_are_fully_consistent(tiny):
    fact = [Example("The Eiffel Tower is in the city of", " Paris")] * 3
    ql = QueryLocalization(tiny, steps=4, progress=False).fit([fact])
    row = ql.consistency_.iloc[0]
    assert row["n_union"] > 0  # a real, non-empty neuron set is compared
    assert row["cs1"] == 1.0 and row["cs2"] == 1.0 and row["class"] == "consistent"


def test_disjoint_sets_score_zero(tiny):
    sets = [[(0, 1), (0, 2)], [(1, 3)], [(2, 4), (3, 5)]]
    ql = QueryLocalization(tiny, progress=False).fit_scores(_scores(tiny, [sets]))
    row = ql.consistency_.iloc[0]
    assert row["cs1"] == 0.0 and row["cs2"] == 0.0 and row["n_intersection"] == 0 and row["n_union"] == 5
    assert row["class"] == "inconsistent"
    masks = [NeuronSet.from_indices(s, tiny.cfg.n_layers, tiny.cfg.d_mlp) for s in sets]
    assert ci.metrics.consistency(masks) == (0.0, 0.0)


def test_partial_overlap_matches_hand_computation(tiny):
    a, b, c = (0, 1), (1, 2), (2, 3)
    ql = QueryLocalization(tiny, progress=False).fit_scores(_scores(tiny, [[[a, b], [a, c], [a, b, c]]]))
    row = ql.consistency_.iloc[0]
    assert row["cs1"] == pytest.approx(1 / 3)  # {a} / {a, b, c}
    assert row["cs2"] == pytest.approx((1 / 3 + 2 / 3 + 2 / 3) / 3)


def test_otsu_splits_a_bimodal_sample():
    rng = np.random.default_rng(0)
    low, high = rng.normal(0.1, 0.03, 40), rng.normal(0.7, 0.05, 60)
    t = ci.metrics.otsu_threshold(np.concatenate([low, high]))
    assert low.max() < t <= high.min()


def test_otsu_and_static_classes(tiny):
    base = [(0, i) for i in range(10)]
    facts = []
    for m in (0, 1, 2, 8, 9, 10):  # Jaccard m / (20 - m): 0, .05, .11 | .67, .82, 1
        facts.append([base, base[:m] + [(1, 100 + j) for j in range(10 - m)]])
    ql = QueryLocalization(tiny, tau="otsu", progress=False).fit_scores(_scores(tiny, facts))
    df = ql.consistency_
    assert list(df["class"]) == ["inconsistent"] * 3 + ["consistent"] * 3
    assert 0.111 < ql.tau_otsu_ <= 0.667
    s = ql.summary()
    assert s["share_inconsistent_otsu"] == 0.5 and s["share_inconsistent_static"] == 0.5
    assert s["welch_t"] > 0
    fig = ql.plot()
    assert isinstance(fig, go.Figure) and len(fig.data) == 2 and len(fig.layout.shapes) == 2
    strict = QueryLocalization(tiny, tau=0.9, score="cs1", progress=False).fit_scores(_scores(tiny, facts))
    assert list(strict.consistency_["class"]) == ["inconsistent"] * 5 + ["consistent"]


def test_cas_rewards_mean_and_penalizes_spread(tiny):
    s = torch.zeros(3, tiny.cfg.n_layers, tiny.cfg.d_mlp)
    s[:, 0, 0] = torch.tensor([1.0, 1.0, 1.0])  # steady
    s[:, 0, 1] = torch.tensor([3.0, 0.0, 0.0])  # same mean, spread
    s[:, 0, 2] = torch.tensor([0.5, 0.5, 0.5])  # steady, smaller
    cas = consistency_aware_scores(s, beta1=1.0, beta2=1.0, normalize=False)
    assert cas[0, 0] == pytest.approx(1.0) and cas[0, 2] == pytest.approx(0.5)
    assert cas[0, 1] == pytest.approx(1.0 - np.sqrt(2.0), abs=1e-6)
    assert consistency_aware_scores(s, 1.0, 0.0, normalize=False)[0, 1] == pytest.approx(1.0)
    normed = s / s.flatten(1).max(1).values[:, None, None]
    torch.testing.assert_close(
        consistency_aware_scores(s, 2.0, 0.5), 2 * normed.mean(0) - 0.5 * normed.std(0, correction=0)
    )
    ql = QueryLocalization(tiny, normalize=False, progress=False).fit_scores([s])
    assert set(ql.neurons(0, "consistency-aware")) == {(0, 0), (0, 2)}
    assert set(ql.neurons(0, "union")) == {(0, 0), (0, 1), (0, 2)}


def test_planted_facts_have_their_own_neurons(planted):
    ql = QueryLocalization(planted, steps=5, progress=False).fit({"eiffel": FACT_A, "japan": FACT_B})
    assert list(ql.consistency_.index) == ["eiffel", "japan"]
    assert list(ql.consistency_["answer"]) == ["Paris", "Tokyo"]
    for fact, mine, other in (("eiffel", NEURONS_A, NEURONS_B), ("japan", NEURONS_B, NEURONS_A)):
        cas = set(ql.neurons(fact, "consistency-aware"))
        assert set(mine) <= cas and not set(other) & cas
        assert set(ql.neurons(fact, "query", query=1)) <= set(ql.neurons(fact, "union"))
        assert set(ql.neurons(fact, "intersection")) <= set(ql.neurons(fact, "query", query=0))
    assert ql.index_of(list(FACT_B)) == 1


@pytest.mark.parametrize(
    "facts, match",
    [
        ([], "no facts"),
        ([[Example("The capital of Japan is", " Tokyo")]], "at least 2"),
        ([[Example("The capital of Japan is", " Tokyo"), Example("Japan's capital is", " Kyoto")]], "mixes answers"),
        (FACT_A, "single Example"),
        ([FACT_A, [Example("The capital of ", "Tokyo"), Example("Japan's capital is ", "Tokyo")]], "tokenize"),
    ],
)
def test_bad_facts_are_refused_before_work(tiny, monkeypatch, facts, match):
    monkeypatch.setattr(KN, "fit", lambda *a, **k: pytest.fail("attribution ran before validation"))
    with pytest.raises(ValueError, match=match):
        QueryLocalization(tiny, progress=False).fit(facts)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"localizer": "nope"}, "unknown localizer"),
        ({"localizer": "cnl"}, "per-query"),
        ({"tau": "mean"}, "otsu"),
        ({"tau": 1.5}, r"\[0, 1\]"),
        ({"score": "cs3"}, "score"),
        ({"threshold": 1.5}, "threshold"),
        ({"localizer": "causal_trace"}, "per-query"),
        ({"beta2": -1}, "beta"),
        ({"steps": 0}, "steps"),
    ],
)
def test_bad_parameters(tiny, kwargs, match):
    with pytest.raises(ValueError, match=match):
        QueryLocalization(tiny, **kwargs)


def test_unfitted_and_unknown_fact(tiny):
    ql = QueryLocalization(tiny, progress=False)
    with pytest.raises(RuntimeError, match="not fitted"):
        ql.summary()
    ql.fit_scores(_scores(tiny, [[[(0, 1)], [(0, 1)]]]))
    with pytest.raises(ValueError, match="not one of"):
        ql.neurons(5)
    with pytest.raises(ValueError, match="unknown selection"):
        ql.neurons(0, "all")
    with pytest.raises(TypeError):  # the former name of selection is gone
        ql.neurons(0, method="union")
    assert ql.neurons(0, "union").meta["selection"] == {"criterion": "union"}


# ------------------------------------------------------------------------------ attention (KS)


def test_subject_synapses_are_the_subject_tokens(tiny):
    ex = Example("The Eiffel Tower is in the city of", " Paris", {"subject": "Eiffel Tower"})
    pos = knowledge_synapses(tiny, ex, "subject")
    toks = [tiny.tokenizer.decode([i]) for i in prompt_ids(tiny, ex.prompt)]  # the ids capinterp feeds
    assert "".join(toks[p] for p in pos).strip() == "Eiffel Tower"
    assert len(knowledge_synapses(tiny, ex, "top", k=2)) == 2
    with pytest.raises(ValueError, match="subject"):
        knowledge_synapses(tiny, Example(ex.prompt, ex.target), "subject")
    with pytest.raises(ValueError, match="unknown KS rule"):
        knowledge_synapses(tiny, ex, "middle")


def test_scale_attention_scales_the_pattern_and_cleans_up(tiny):
    ids = tiny.to_tokens("The Eiffel Tower is in the city of")
    name = "blocks.0.attn.hook_pattern"
    clean_logits, clean = tiny.run_with_cache(ids, names_filter=lambda n: n == name)
    with scale_attention(tiny, [2, 3], 0.5):
        _, scaled = tiny.run_with_cache(ids, names_filter=lambda n: n == name)
    torch.testing.assert_close(scaled[name][0, :, -1, [2, 3]], 0.5 * clean[name][0, :, -1, [2, 3]])
    torch.testing.assert_close(scaled[name][0, :, -1, 4:], clean[name][0, :, -1, 4:])
    torch.testing.assert_close(tiny(ids), clean_logits, rtol=0, atol=0)
    with pytest.raises(ValueError, match="layers"), scale_attention(tiny, [1], 2.0, layers=[99]):
        pass


def test_attention_scaling_experiment(planted):
    exs = [Example(q.prompt, q.target, {"subject": "Eiffel Tower"}) for q in FACT_A]
    df = attention_scaling(planted, exs, factors=(1.0, 0.0), neurons=NeuronSet.from_indices(NEURONS_A, 4, 128))
    assert set(df["arm"]) == {"ks", "control"} and len(df) == 2 * 2 * len(exs)
    one = df[df["factor"] == 1.0]
    np.testing.assert_allclose(one["p_after"], one["p_before"], rtol=1e-5)
    np.testing.assert_allclose(one["act_after"], one["act_before"], rtol=1e-5)
    zero = df[(df["factor"] == 0.0) & (df["arm"] == "ks")]
    assert (zero["delta"].abs() > 1e-6).all()
    with pytest.raises(ValueError, match="factor"):
        attention_scaling(planted, exs, factors=())


@pytest.mark.slow
def test_query_localization_on_smollm2(smollm2):
    import time

    start = time.time()
    facts = {
        "eiffel": [
            "The Eiffel Tower is located in the city of",
            "The Eiffel Tower is in the city of",
            "The Eiffel Tower can be found in the city of",
        ],
        "japan": ["The capital of Japan is", "The capital city of Japan is", "Japan's capital city is"],
    }
    answers = {"eiffel": " Paris", "japan": " Tokyo"}
    groups = {k: ci.data.facts_known_by(smollm2, [Example(p, answers[k]) for p in ps]) for k, ps in facts.items()}
    groups = {k: g for k, g in groups.items() if len(g) >= 2}
    assert len(groups) == 2, "SmolLM2 should know both facts on at least two paraphrases"
    ql = QueryLocalization(smollm2, steps=8, progress=False).fit(groups)
    df = ql.consistency_
    assert ((df["cs1"] >= 0) & (df["cs1"] <= df["cs2"]) & (df["cs2"] <= 1)).all() and (df["n_union"] > 0).all()
    edit = ci_edit(smollm2, groups["eiffel"], ql, unrelated=groups["japan"])
    assert edit.metrics["rel_prob"] > 0  # erasing the fact's neurons lowers p(Paris) on the edited query
    assert time.time() - start < 120


def ci_edit(model, fact, ql, unrelated):
    from capinterp.interventions.editing import edit_knowledge

    before = {k: v.clone() for k, v in model.state_dict().items() if "mlp" in k}
    edit = edit_knowledge(model, fact, "union", "erase", ql=ql, unrelated=unrelated)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items() if "mlp" in k)
    return edit


def test_progress_bar_names_the_localizer_and_counts_queries(tiny, capsys):
    fact = [Example("The Eiffel Tower is in the city of", " Paris")] * 2
    QueryLocalization(tiny, localizer="kn", steps=2, progress=True).fit([fact, fact])
    err = capsys.readouterr().err
    assert "query localization (kn)" in err and "4/4" in err
    QueryLocalization(tiny, localizer="kn", steps=2, progress=False).fit([fact, fact])
    assert "query localization" not in capsys.readouterr().err


@pytest.mark.parametrize("family", ["gptj", "opt", "llama4_text", "llama", "gpt2"])
def test_scale_attention_refuses_where_pattern_writes_do_not_reach_the_output(family):
    """On some bridge adapters attn.hook_pattern only observes: scaling there would silently change
    nothing, so it is refused naming the family; where writes reach the output, scaling moves it."""
    from capinterp.arch.family import UnsupportedFamily
    from capinterp.arch.tiny import tiny_hf

    hf, tok = tiny_hf(family)
    model = ci.load_model(hf, tokenizer=tok)
    ids = tok("The Eiffel Tower is in", return_tensors="pt")["input_ids"]
    if family in ("gptj", "opt", "llama4_text"):
        with pytest.raises(UnsupportedFamily, match=f"^{family} .*hook_pattern does not reach"):
            with scale_attention(model, [1], 2.0):
                pass
        return
    with torch.no_grad():
        clean = model(ids)
        with scale_attention(model, [1, 2], 3.0):
            scaled = model(ids)
    assert float((scaled - clean).abs().max()) > 1e-3
