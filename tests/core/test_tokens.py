import pytest

from capinterp.core.example import Example, as_examples
from capinterp.core.tokens import TokenizationError, collate, encode, pad_id


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
    with pytest.raises(TokenizationError, match="does not tokenize"):
        encode(tiny, [bad])
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
    ex = as_examples([("a", "b"), {"prompt": "c", "target": "d", "k": 1}, "e"])
    assert [(x.prompt, x.target) for x in ex] == [("a", "b"), ("c", "d"), ("e", "")]
    assert ex[1].meta == {"k": 1}
    with pytest.raises(TypeError, match="item 0"):
        as_examples([3])
