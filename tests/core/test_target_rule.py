"""The one rule for targets (issue 46 finding 1, issue 51 item 1), at every entry point.

- A target that glues onto the prompt's last word (``"... is"`` + ``"Berlin"``) is refused before
  any model work, with the fix in the message (``target ' Berlin'``); arithmetic (``"3+4="`` +
  ``"7"``) and unspaced scripts are not glued.
- The target's token is the first one that carries the answer: whitespace the tokenizer keeps as a
  token of its own is context, and a first character split into byte fragments is refused.
"""

from __future__ import annotations

import pandas as pd
import pytest
import torch

import capinterp as ci
from capinterp.core.example import Example, as_examples, glued_words
from capinterp.core.tokens import TokenizationError, encode
from capinterp.data.parsing import is_correct

GLUED = ("The capital of Germany is", "Berlin")
FIX = "target ' Berlin'"


@pytest.mark.parametrize(
    ("prompt", "target", "glued"),
    [
        ("The capital of Germany is", "Berlin", True),
        ("The capital of Germany is", " Berlin", False),
        ("In 19", "84", True),
        ("3+4=", "7", False),
        ("Answer:", "7", False),
        ("中国的首都是", "北京", False),
        ("The answer is", "(b)", False),
        ("Café", "s", True),
    ],
)
def test_glued_words(prompt, target, glued):
    assert glued_words(prompt, target) is glued


def test_every_input_form_is_refused_alike_with_the_fix():
    forms = [
        [GLUED],
        [list(GLUED)],
        [{"prompt": GLUED[0], "target": GLUED[1]}],
        [Example(*GLUED)],
        pd.DataFrame({"prompt": [GLUED[0]], "target": [GLUED[1]]}),
    ]
    for data in forms:
        with pytest.raises(TokenizationError, match=FIX):
            as_examples(data)
    assert as_examples([("3+4=", "7"), ("中国的首都是", "北京"), (GLUED[0], " Berlin")])  # accepted
    assert as_examples([GLUED[0]])[0].wants_greedy  # a bare prompt asks for the model's own token


def test_loader_and_dataframe_of_one_csv_no_longer_disagree(tmp_path):
    """The CSV's loader spaces the target; the same rows as a DataFrame are refused, never scored as
    another token (they were: mean p 0.276 against 0.390 on SmolLM2)."""
    path = tmp_path / "facts.csv"
    pd.DataFrame({"prompt": [GLUED[0]], "target": [GLUED[1]]}).to_csv(path, index=False)
    (ex,) = ci.data.load_jsonl(path)
    assert (ex.prompt, ex.target) == (GLUED[0], " Berlin")
    with pytest.raises(TokenizationError, match=FIX):
        as_examples(pd.read_csv(path))


def test_entry_points_refuse_before_any_forward(tiny):
    """evaluate, the localizers, faithfulness and the editors all refuse the glued target, and the
    model never runs (a forward pre-hook counts calls)."""
    calls = []
    handle = tiny.blocks[0].register_forward_pre_hook(lambda *a: calls.append(1))
    data = [GLUED, ("The capital of France is", " Paris")]
    try:
        runs = [
            lambda: ci.evaluate(tiny, data),
            lambda: ci.KN(tiny).fit(data[:1]),
            lambda: ci.CNL(tiny).fit(data),
            lambda: ci.DCSN(tiny).fit(data),
            lambda: ci.CausalTrace(tiny).fit([Example(*GLUED, {"subject": "Germany"})]),
            lambda: ci.faithfulness(tiny, ci.units.NeuronScores(torch.rand(4, 128)), data, random_sets=1),
            lambda: ci.edit_knowledge(tiny, [Example(*GLUED)], neurons=None, evaluate=False),
        ]
        for run in runs:
            with pytest.raises(TokenizationError, match=FIX):
                run()
    finally:
        handle.remove()
    assert not calls


def test_lone_space_before_the_answer_is_context(tiny):
    """The tiny tokenizer splits " 7" into " " and "7": the scored token is "7", the space context."""
    tok = tiny.tokenizer
    enc = encode(tiny, [Example("The number is:", t) for t in (" 1", " 7", " 10", "7")])
    firsts = [tok.decode([e.target_ids[0]]) for e in enc]
    assert firsts == ["1", "7", "1", "7"]
    assert [e.context_ws for e in enc] == [1, 1, 1, 0]
    assert tok.decode(enc[1].prompt_ids[-1:]) == " "  # the space now ends the context
    assert enc[1].ids == enc[1].prompt_ids + enc[1].target_ids  # the same full text as before
    records = ci.evaluate(tiny, [("The number is:", " 7")]).records
    assert records[0]["token"] == "7"
    # evaluate's prob is p("7" | prompt + " "), computed here by hand
    ids = torch.tensor([enc[1].prompt_ids])
    with torch.no_grad():
        p = tiny(ids)[0, -1].double().softmax(-1)[enc[1].target_ids[0]]
    assert records[0]["prob"] == pytest.approx(float(p), rel=1e-5)


def test_first_character_split_into_bytes_is_refused(tiny):
    with pytest.raises(TokenizationError, match="byte fragments"):
        encode(tiny, [Example("Party time:", " 🎉")])
    with pytest.raises(TokenizationError, match="byte fragments"):
        ci.evaluate(tiny, [("Party time:", " 🎉")])


def test_correct_means_whole_words():
    paris = Example("The capital of France is", " Paris")
    assert is_correct(paris, " Paris.") and is_correct(paris, " Paris") and is_correct(paris, " Paris is")
    assert not is_correct(Example("The capital of France is", " P"), " Paris")
    assert not is_correct(Example("The year is", " 1"), " 12")
    assert is_correct(Example("中国的首都是", "北京"), "北京市")  # unspaced script: no word boundary to keep


def test_evaluate_correct_returns_the_examples_it_got_right(tiny):
    ds = ci.data.arithmetic(ops="+", n=12, seed=0)
    res = ci.evaluate(tiny, ds)
    kept = res.correct()
    assert len(kept) == sum(r["correct"] for r in res.records)
    assert all(k in ds for k in kept)
    assert [r["correct"] for r in res.records].count(True) == len(kept)


@pytest.mark.slow
def test_smollm2_numbers_are_scored_by_their_digits(smollm2):
    """Issue 51: " 1", " 7", " 10", " 99" all got p 0.899 (the lone space); KN scores were identical."""
    prompt = "Alice has 3 apples and buys 4 more. The number of apples she has now is"
    res = ci.evaluate(smollm2, [(prompt, t) for t in (" 1", " 7", " 10", " 99")])
    probs = [r["prob"] for r in res.records]
    assert [r["token"] for r in res.records] == ["1", "7", "1", "9"]
    assert probs[0] == pytest.approx(probs[2])  # same first answer token, same context
    assert len({round(p, 6) for p in probs}) == 3
    kn7 = ci.KN(smollm2, steps=4).fit([(prompt, " 7")]).scores_.scores
    kn9 = ci.KN(smollm2, steps=4).fit([(prompt, " 99")]).scores_.scores
    assert not torch.equal(kn7, kn9)
    with pytest.raises(TokenizationError, match="byte fragments"):
        ci.evaluate(smollm2, [("Party time:", " 🎉")])
    berlin = ci.evaluate(smollm2, [("The capital of Germany is", " Berlin")]).records[0]
    assert berlin["prob"] > 0.1 and berlin["token"] == " Berlin"
