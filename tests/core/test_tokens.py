import pytest

from capinterp.core.example import Example, as_examples
from capinterp.core.tokens import TokenizationError, absorbed_whitespace, collate, encode, pad_id, subject_span


def test_target_tokens_are_taken_in_context(tiny):
    (e,) = encode(tiny, [Example("12*3=", "36")])
    tok = tiny.tokenizer
    # the tiny model's own tokenizer adds no BOS (load_model records that before booting)
    assert tiny.capinterp_adds_bos is False
    assert e.prompt_ids == tok("12*3=", add_special_tokens=False)["input_ids"]
    (f,) = encode(tiny, [Example("12*3=", "36")], prepend_bos=True)
    assert f.prompt_ids == [tok.bos_token_id] + e.prompt_ids
    assert tok.decode(e.target_ids) == "36"
    assert len(e.target_ids) == 2  # digits are single tokens
    assert e.answer_positions == [len(e.prompt_ids) - 1, len(e.prompt_ids)]


def test_boundary_merge_is_an_error_or_skipped(tiny):
    bad = Example("The Eiffel Tower is in the city of ", "Paris")  # trailing space merges with the word
    with pytest.raises(TokenizationError, match="ends in whitespace"):
        encode(tiny, [bad])
    merge = Example("计", "算")  # a merge without whitespace in an unspaced script: "计算" shares a byte token
    with pytest.raises(TokenizationError, match="does not tokenize"):
        encode(tiny, [merge])
    assert encode(tiny, [bad, Example("3+4=", "7")], on_mismatch="skip")[0].example.target == "7"


def test_empty_target_and_long_prompt_errors(tiny):
    with pytest.raises(TokenizationError, match="empty target"):
        encode(tiny, [Example("3+4=", "")])
    with pytest.raises(TokenizationError, match="context"):
        encode(tiny, [Example("1+1=2\n" * 400, "3")])


def test_collate_right_pads(tiny):
    items = encode(tiny, [Example("3+4=", "7"), Example("12*3=", "36")])
    b = collate(items, pad_id(tiny.tokenizer))
    assert b.tokens.shape[0] == 2
    assert b.lengths.tolist() == [len(i.ids) for i in items]
    assert b.tokens[0, b.lengths[0] :].eq(pad_id(tiny.tokenizer)).all()


def test_as_examples_accepts_pairs_dicts_strings():
    ex = as_examples([("a", " b"), {"prompt": "c", "target": " d", "k": 1}, "e"])
    assert [(x.prompt, x.target) for x in ex] == [("a", " b"), ("c", " d"), ("e", "")]
    assert ex[1].meta == {"k": 1}
    with pytest.raises(TypeError, match="item 0"):
        as_examples([3])


@pytest.mark.parametrize("target", ["", " ", "\n\t "])
def test_explicit_empty_or_blank_target_is_refused_everywhere_alike(target):
    """Issue 31 item 1: only a bare prompt means "the greedy token"; ("3+4=", "") is an error."""
    for data in ([("3+4=", target)], [{"prompt": "3+4=", "target": target}], [Example("3+4=", target)]):
        with pytest.raises(TokenizationError, match="empty target"):
            as_examples(data)
    bare = as_examples(["3+4=", {"prompt": "3+4="}])
    assert all(e.target == "" and e.wants_greedy for e in bare)


def test_trailing_whitespace_absorbed_by_the_target_is_refused(tiny):
    """Issue 31 item 5: a prompt ending in whitespace that the target's first word would absorb."""
    tok = tiny.tokenizer
    # " Paris" is one pre-token: a trailing space before it is refused, also when the target
    # brings its own space (the double space tokenizes cleanly, but no real text looks like it)
    for prompt, target in [("The city of ", "Paris"), ("The city of ", " Paris"), ("The city of\n ", "Paris")]:
        assert absorbed_whitespace(tok, prompt, target) is not None
        with pytest.raises(TokenizationError, match="ends in whitespace") as err:
            encode(tiny, [Example(prompt, target)])
        assert "target ' Paris'" in str(err.value)  # the fix is spelled out
        assert encode(tiny, [Example(prompt, target)], on_mismatch="skip") == []
    # the tiny tokenizer splits digits from a leading space (as SmolLM2 does): nothing is absorbed
    # and "3+4= " + "7" gives the same tokens as "3+4=" + " 7"
    assert absorbed_whitespace(tok, "3+4= ", "7") is None
    (a,) = encode(tiny, [Example("3+4= ", "7")])
    (b,) = encode(tiny, [Example("3+4=", " 7")])
    assert a.ids == b.ids
    assert absorbed_whitespace(tok, "```python\n", "def f():") is None  # a newline stays its own token
    assert absorbed_whitespace(tok, "The city of", " Paris") is None


def test_subject_must_sit_on_token_boundaries(tiny):
    """Issue 31 item 4: one rule (subject_span) for tracing and ROME; the message shows the tokens."""
    tok, text = tiny.tokenizer, "The Eiffel Tower is in the city of"
    s0, s1 = subject_span(tok, text, "Eiffel Tower")
    pieces = [tok.decode([t]) for t in tok(text, add_special_tokens=False)["input_ids"]]
    assert "".join(pieces[s0:s1]).strip() == "Eiffel Tower"
    assert subject_span(tok, text, "Eiffel Tower", offset=1) == (s0 + 1, s1 + 1)
    for part, where in [("Eiffel Tow", "end"), ("iffel Tower", "start")]:
        with pytest.raises(TokenizationError, match=f"does not {where} on a token boundary") as err:
            subject_span(tok, text, part)
        assert "' Tower'*" in str(err.value) or "' Eiff'*" in str(err.value)  # the tokens are shown
    with pytest.raises(ValueError, match="not found"):
        subject_span(tok, text, "Louvre")


def test_packaged_tokenizers_absorb_a_space_before_a_word_not_before_a_digit(smollm2):
    """The rule on a real BPE: SmolLM2 splits " 7" into " " + "7" but " Paris" is one token."""
    tok = smollm2.tokenizer
    assert absorbed_whitespace(tok, "3+4= ", "7") is None
    assert absorbed_whitespace(tok, "The city of ", " Paris") == " "
    assert absorbed_whitespace(tok, "The city of ", "Paris") == " "
    with pytest.raises(TokenizationError, match="empty target"):
        encode(smollm2, [Example("3+4=", " ")])
