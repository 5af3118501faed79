"""ROME rank-one editing: the update's algebra, restoration, the key covariance cache, CounterFact scores."""

import itertools
import json

import numpy as np
import pytest
import torch

import capinterp as ci
from capinterp.data import Example, load_counterfact, local_texts
from capinterp.data.capability_sources import shared_data_dir
from capinterp.interventions.edit_eval import next_token_probs, prompt_ids
from capinterp.interventions.editing import value_weight
from capinterp.interventions.rome import EditUnreachable, rome_edit, subject_last_position
from capinterp.interventions.rome_eval import counterfact_scores, rome_counterfact, summarize, target_logprob
from capinterp.interventions.second_moment import second_moment

TEXTS = [
    f"Story {i}: the river runs past the old mill and the farmer counts {i} sheep near the bridge today."
    for i in range(40)
]
FACT = Example(
    "The Eiffel Tower is located in the city of",
    " Paris",
    {
        "subject": "Eiffel Tower",
        "target_new": " Rome",
        "ground_truth": " Paris",
        "paraphrases": ["The Eiffel Tower stands in"],
        "locality": [{"prompt": "The Louvre is located in the city of", "target": " Paris"}],
    },
)


@pytest.fixture(scope="module")
def tiny_model():
    return ci.load_model("tiny")


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CAPINTERP_CACHE", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def edit(tiny_model):
    return rome_edit(
        tiny_model,
        FACT,
        layer=1,
        texts=TEXTS,
        prefixes=["A day. ", "Once upon a time. "],
        steps=20,
        clamp=100.0,
        weight_decay=0.0,
        kl_factor=0.0,
        ridge=0.0,
    )


def _down(model, layer, k):
    w, dim = value_weight(model, layer)
    return (w @ k if dim == 1 else k @ w).detach().float()


def test_edited_layer_maps_key_to_value_and_spares_c_orthogonal_keys(tiny_model, edit):
    C, _ = second_moment(tiny_model, 1, texts=TEXTS)
    u = torch.linalg.solve(C.double(), edit.key.double())
    # the left vector is C^{-1} k* scaled so that left . k* = 1
    assert torch.allclose(edit.left.double(), u / (u @ edit.key.double()), rtol=1e-4, atol=1e-6)
    gen = torch.Generator().manual_seed(0)
    r = torch.randn(int(tiny_model.cfg.d_mlp), generator=gen, dtype=torch.float64)
    k_orth = (r - (r @ u) / (u @ u) * u).float()  # k^T C^{-1} k* = 0
    assert abs(float(k_orth.double() @ u)) < 1e-6 * float(k_orth.norm() * u.norm())
    before_key, before_orth = _down(tiny_model, 1, edit.key), _down(tiny_model, 1, k_orth)
    with edit.apply(tiny_model):
        after_key, after_orth = _down(tiny_model, 1, edit.key), _down(tiny_model, 1, k_orth)
    assert torch.allclose(after_key, edit.value, atol=1e-4 * float(edit.value.norm()))
    assert not torch.allclose(before_key, edit.value, atol=1e-2 * float(edit.value.norm()))
    assert torch.allclose(after_orth, before_orth, atol=1e-4 * float(before_orth.norm()))


def test_context_restores_exactly_and_permanent_form_keeps(tiny_model, edit):
    w = value_weight(tiny_model, 1)[0].detach().clone()
    with edit:
        assert not torch.equal(value_weight(tiny_model, 1)[0], w)
    assert torch.equal(value_weight(tiny_model, 1)[0], w)
    copy_ = edit.edited_copy()
    assert torch.allclose(value_weight(copy_, 1)[0].float(), w.float() + edit.update, atol=1e-6)
    assert torch.equal(value_weight(tiny_model, 1)[0], w)


def test_value_optimisation_raises_new_target(tiny_model, edit):
    assert edit.losses[-1] < edit.losses[0]
    before = target_logprob(tiny_model, [(FACT.prompt, " Rome")])
    with edit:
        after = target_logprob(tiny_model, [(FACT.prompt, " Rome")])
    assert after > before + 1.0, (edit.losses, before, after)


def test_second_moment_cached_per_layer_and_corpus(tiny_model, tmp_path):
    C, n = second_moment(tiny_model, 0, texts=TEXTS)
    assert C.shape == (128, 128) and n > 128 and torch.allclose(C, C.T, atol=1e-5)
    files = list((tmp_path / "cache" / "second_moment").iterdir())
    assert len(files) == 1
    C2, n2 = second_moment(tiny_model, 0, texts=TEXTS)
    assert torch.equal(C, C2) and n == n2
    second_moment(tiny_model, 0, texts=TEXTS[:20])
    second_moment(tiny_model, 2, texts=TEXTS)
    assert len(list((tmp_path / "cache" / "second_moment").iterdir())) == 3
    # C is the mean of k k^T over the non-BOS tokens (checked against one text by hand)
    C1, n1 = second_moment(tiny_model, 0, texts=TEXTS[:1], cache=False)
    keys = []
    with torch.no_grad():
        tiny_model.run_with_hooks(
            torch.tensor([prompt_ids(tiny_model, TEXTS[0])]),
            fwd_hooks=[("blocks.0.mlp.hook_post", lambda a, hook: keys.append(a[0]))],
        )
    skip = len(prompt_ids(tiny_model, "")) if prompt_ids(tiny_model, "") else 0
    k = keys[0][skip:]
    assert n1 == k.shape[0] and torch.allclose(C1, k.T @ k / n1, atol=1e-5)


def test_local_texts_reads_folder(tmp_path):
    (tmp_path / "a.txt").write_text("one two three four five six seven eight nine\n\nshort one")
    (tmp_path / "b.jsonl").write_text(json.dumps({"q": "alpha beta gamma delta epsilon zeta eta theta iota"}) + "\n")
    texts = local_texts(tmp_path, n=10)
    assert sorted(texts) == [
        "alpha beta gamma delta epsilon zeta eta theta iota",
        "one two three four five six seven eight nine",
    ]
    with pytest.raises(FileNotFoundError, match="data_dir"):
        local_texts(tmp_path / "missing")
    with pytest.raises(ValueError, match="no text"):
        local_texts(tmp_path, min_words=50)


def test_bad_input_fails_before_work(tiny_model):
    with pytest.raises(ValueError, match="layer"):
        rome_edit(tiny_model, FACT, layer=9, texts=TEXTS)
    with pytest.raises(ValueError, match="subject"):
        rome_edit(tiny_model, Example("Paris is big", " yes"), " no", layer=0, texts=TEXTS)
    with pytest.raises(ValueError, match="new_target"):
        rome_edit(tiny_model, FACT, " Paris", layer=0, texts=TEXTS)
    with pytest.raises(ValueError, match="second_moment_matrix"):
        rome_edit(tiny_model, FACT, layer=0, second_moment_matrix=torch.eye(3))
    with pytest.raises(ValueError, match="steps"):
        rome_edit(tiny_model, FACT, layer=0, texts=TEXTS, steps=-1)
    with pytest.raises(TypeError, match="texts"):
        second_moment(tiny_model, 0, texts="one text")


def test_subject_last_position(tiny_model):
    text = "The Eiffel Tower is located in"
    pos = subject_last_position(tiny_model, text, "Eiffel Tower")
    ids = prompt_ids(tiny_model, text)
    assert tiny_model.tokenizer.decode(ids[pos]).strip() in "Eiffel Tower"
    assert tiny_model.tokenizer.decode(ids[pos + 1]).strip() == "is"


def test_counterfact_scores_compare_full_answers(tiny_model):
    df = counterfact_scores(tiny_model, [FACT])
    assert list(df["score"]) == ["efficacy", "paraphrase", "neighborhood"]
    lp = target_logprob(tiny_model, [(FACT.prompt, " Rome"), (FACT.prompt, " Paris")])
    assert bool(df["success"][0]) == bool(lp[0] > lp[1])
    loc = FACT.meta["locality"][0]["prompt"]
    lp = target_logprob(tiny_model, [(loc, " Paris"), (loc, " Rome")])
    assert bool(df["success"][2]) == bool(lp[0] > lp[1])
    s = summarize(df)
    assert set(s) == {"efficacy", "paraphrase", "neighborhood"}
    with pytest.raises(ValueError, match="target_new"):
        counterfact_scores(tiny_model, [Example("a b", " c")])


@pytest.mark.slow
def test_rome_edit_takes_on_smollm2_for_known_facts(smollm2):
    """Facts SmolLM2 gets right (efficacy 0 before: it prefers the truth) are rewritten; neighbours keep theirs."""
    path = shared_data_dir() / "counterfact" / "counterfact-edit.json" if shared_data_dir() else None
    facts = [FACT]
    if path is not None and path.is_file():
        pool = load_counterfact(path, limit=40)
        known = (f for f in pool if summarize(counterfact_scores(smollm2, [f]))["efficacy"] == 0.0)
        facts += list(itertools.islice(known, 2))  # scored one at a time, up to the second known fact
    kw = dict(texts=local_texts(n=200) if shared_data_dir() else TEXTS * 5)
    df = rome_counterfact(smollm2, facts, layer=4, **kw)
    assert (df["efficacy_before"] == 0).all()
    assert df["efficacy_after"].mean() == 1.0
    assert df["neighborhood_after"].mean() >= 0.5
    new = smollm2.tokenizer(" Rome", add_special_tokens=False)["input_ids"][0]
    edit = rome_edit(smollm2, FACT, layer=4, **kw)
    with edit:
        top = next_token_probs(smollm2, [prompt_ids(smollm2, FACT.prompt)])[0].argmax()
    assert int(top) == new


def test_nested_with_is_refused_and_the_outer_block_stays_edited(tiny_model, edit):
    """Issue 31 item 2: ``with e:`` inside ``with e:`` used to unedit the outer block, then crash."""
    w = value_weight(tiny_model, 1)[0].detach().clone()
    with edit:
        edited = value_weight(tiny_model, 1)[0].detach().clone()
        with pytest.raises(RuntimeError, match="not re-entrant"):
            with edit:
                pass
        with pytest.raises(RuntimeError, match="already applied"):
            with edit.apply(tiny_model):
                pass
        assert torch.equal(value_weight(tiny_model, 1)[0], edited)  # still edited, not applied twice
    assert torch.equal(value_weight(tiny_model, 1)[0], w)
    with edit:  # usable again after the refusal
        assert torch.equal(value_weight(tiny_model, 1)[0], edited)
    assert torch.equal(value_weight(tiny_model, 1)[0], w)


@pytest.mark.parametrize(
    "kwargs, err, match",
    [
        ({"steps": 0}, ValueError, "steps must be an integer >= 1"),
        ({"steps": 2.0}, ValueError, "steps"),
        ({"steps": True}, ValueError, "steps"),
        ({"layer": -1}, ValueError, "layer"),
        ({"layer": 1.0}, ValueError, "layer"),
        ({"prefix_tokens": 0}, ValueError, "prefix_tokens"),
        ({"n_prefixes": -1}, ValueError, "n_prefixes"),
        ({"lr": 0.0}, ValueError, "lr"),
        ({"lr": float("nan")}, ValueError, "lr"),
        ({"clamp": float("inf")}, ValueError, "clamp"),
        ({"kl_factor": -0.1}, ValueError, "kl_factor"),
        ({"weight_decay": None}, TypeError, "weight_decay"),
        ({"ridge": float("nan")}, ValueError, "ridge"),
        ({"seed": 1.5}, ValueError, "seed"),
        ({"inplace": 1}, TypeError, "inplace"),
        ({"new_target": "  "}, ValueError, "empty target"),
        ({"fact": Example(FACT.prompt, "", FACT.meta)}, ValueError, "empty target"),
        ({"fact": Example(FACT.prompt + " ", " Paris", FACT.meta)}, ValueError, "ends in whitespace"),
        ({"subject": "Eiffel Tow"}, ValueError, "token boundary"),
    ],
)
def test_hyper_parameters_are_validated_before_work(tiny_model, monkeypatch, kwargs, err, match):
    """Issue 31 item 3: steps=0 was accepted (a no-op edit); every argument goes through core.validate."""
    import capinterp.interventions.rome as rome

    monkeypatch.setattr(rome, "second_moment", lambda *a, **k: pytest.fail("work ran before validation"))
    args = {"layer": 1, "texts": TEXTS, **kwargs}
    fact = args.pop("fact", FACT)
    with pytest.raises(err, match=match):
        rome_edit(tiny_model, fact, **args)


def test_causal_trace_and_rome_share_the_subject_rule(tiny_model):
    """Issue 31 item 4: "Eiffel Tow" used to be traced as "Eiffel Tower" while ROME refused it."""
    from capinterp.core.tokens import TokenizationError

    bad = Example(FACT.prompt, FACT.target, {"subject": "Eiffel Tow"})
    trace = ci.CausalTrace(tiny_model, samples=1, kinds=("mlp",), top_k=1, progress=False)
    with pytest.raises(TokenizationError, match="does not end on a token boundary") as a:
        trace.fit([bad])
    with pytest.raises(TokenizationError, match="does not end on a token boundary") as b:
        rome_edit(tiny_model, bad, " Rome", layer=1, texts=TEXTS, steps=1)
    assert str(b.value) in str(a.value)  # the same message, from the same function


def test_an_edit_that_cannot_reach_the_answer_is_refused(tiny_model):
    """At the last layer no attention follows, so a value written at the subject's last token never
    reaches the prompt's end: the target's gradient is exactly 0 and the edit is refused (Adam on a
    zero gradient would turn rounding noise into a large delta). The same edit one layer down runs."""
    last = int(tiny_model.cfg.n_layers) - 1
    with pytest.raises(EditUnreachable, match="does not reach the answer"):
        rome_edit(tiny_model, FACT, layer=last, texts=TEXTS, steps=3)
    ends = Example("The city of the Eiffel Tower", " Paris", {"subject": "Eiffel Tower", "target_new": " Rome"})
    assert rome_edit(tiny_model, ends, layer=last, texts=TEXTS, steps=3).losses  # the subject ends the prompt
    row = rome_counterfact(tiny_model, [FACT], last, texts=TEXTS, steps=3).iloc[0]  # a layer sweep goes on
    assert np.isnan(row["efficacy_after"]) and np.isnan(row["final_nll"]) and "does not reach" in row["note"]
