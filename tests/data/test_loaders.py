"""Fact loaders: real files in ../shared/data (skipped when absent), temp files for shapes and errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from capinterp.core.example import Example
from capinterp.core.tokens import TokenizationError
from capinterp.data.facts import (
    builtin_facts,
    facts_known_by,
    join_target,
    load_counterfact,
    load_jsonl,
    load_known_facts,
    load_pararel_bags,
)

DATA = Path(__file__).resolve().parents[3] / "shared" / "data"
needs_data = pytest.mark.skipif(not DATA.is_dir(), reason=f"{DATA} is not available")


# ------------------------------------------------------------------------------ real data


@needs_data
def test_known_1000():
    facts = load_known_facts(DATA / "rome_knowns" / "known_1000.json")
    assert len(facts) == 1209
    ex = facts[0]
    assert ex.prompt == "Vinson Massif is located in the continent of" and ex.target == " Antarctica"
    assert ex.meta["subject"] == "Vinson Massif" and ex.meta["relation_id"] == "P30"
    assert all(f.meta["subject"] in f.prompt for f in facts)
    assert all(f.target.startswith(" ") and not f.target.startswith("  ") for f in facts)
    assert all(not f.prompt.endswith(" ") for f in facts)
    assert len(load_known_facts(DATA / "rome_knowns" / "known_1000.json", limit=5)) == 5


@needs_data
def test_counterfact_flattened():
    facts = load_counterfact(DATA / "counterfact" / "counterfact-edit.json")
    assert len(facts) == 10000
    ex = facts[0]
    assert ex.prompt == "The mother tongue of Danielle Darrieux is" and ex.target == " French"
    m = ex.meta
    assert m["subject"] == "Danielle Darrieux" and m["target_new"] == " English" and m["ground_truth"] == " French"
    assert m["paraphrases"] == ["Where Danielle Darrieux is from, people speak the language of"]
    assert m["rephrase_prompt"] == m["paraphrases"][0]
    assert m["locality"] == [{"prompt": "Michel Rocard is a native speaker of", "target": " French"}]
    new = load_counterfact(DATA / "counterfact" / "counterfact-edit.json", target="new", limit=3)
    assert new[0].target == " English" and len(new) == 3


@needs_data
def test_pararel_bags():
    bags = load_pararel_bags(DATA / "knowledge_neurons" / "data_11.json")
    assert len(bags) == 937
    first = bags[0]
    assert {ex.meta["fact_id"] for ex in first} == {0}
    assert first[0].prompt == "Edmonton is the capital of" and first[0].target == " Alberta"
    assert all("[MASK]" not in ex.prompt for bag in bags for ex in bag)
    assert all(ex.meta["subject"] == "Edmonton" for ex in first)
    # P36 facts: "The capital of Azerbaijan is [MASK] ." -> subject Azerbaijan, truncated at the mask
    p36 = next(bag for bag in bags if bag[0].meta["relation_id"] == "P36")
    assert p36[0].prompt.endswith(" is") and p36[0].meta["subject"] in p36[0].prompt
    assert all(ex.meta["subject"] and ex.meta["subject"] in ex.prompt for bag in bags for ex in bag)
    assert all(ex.meta["n_paraphrases"] == len(bag) for bag in bags for ex in bag)
    assert len(load_pararel_bags(DATA / "knowledge_neurons" / "data_11.json", limit=4)) == 4


@needs_data
def test_jsonl_shapes_on_real_files():
    z = load_jsonl(DATA / "zsre" / "zsre_mend_train-1k.json", "src", "answers")
    assert z[0].prompt == "What is the product made by UniFirst?" and z[0].target == " uniform"
    assert z[0].meta["subject"] == "UniFirst" and z[0].meta["answers"] == ["uniform"]
    e = load_jsonl(DATA / "emotion" / "test.jsonl", "text", "label")
    assert len(e) == 2000 and e[0].target == " sadness"
    g = load_jsonl(DATA / "gsm8k" / "test.jsonl", "question", lambda r: r["answer"].split("#### ")[-1])
    assert g[0].target == " 18"
    imdb = load_jsonl(DATA / "imdb" / "imdb_reviews_first2499.csv", "review", "sentiment")
    assert len(imdb) == 2499 and imdb[0].target in (" positive", " negative")


# ------------------------------------------------------------------------------ shapes / spacing


def _write(tmp_path: Path, name: str, obj) -> Path:
    p = tmp_path / name
    p.write_text(obj if isinstance(obj, str) else json.dumps(obj))
    return p


def test_join_target_spacing():
    assert join_target("The city of", "Paris") == ("The city of", " Paris")
    assert join_target("The city of ", " Paris ") == ("The city of", " Paris")
    assert join_target("2+3=", "5", "auto") == ("2+3=", "5")
    assert join_target("Answer:", "5", "auto") == ("Answer:", " 5")
    assert join_target("Q\n", "yes", "auto") == ("Q\n", "yes")
    assert join_target("x ", "y", False) == ("x", " y")
    with pytest.raises(ValueError):
        join_target("a", "b", "sometimes")


def test_load_jsonl_shapes(tmp_path):
    rows = [{"q": "The capital of Italy is", "a": "Rome", "subject": "Italy"}, {"q": "2+2=", "a": 4}]
    lines = _write(tmp_path, "a.jsonl", "\n".join(json.dumps(r) for r in rows) + "\n\n")
    listed = _write(tmp_path, "b.json", rows)
    wrapped = _write(tmp_path, "c.json", {"version": 1, "data": rows})
    by_id = _write(tmp_path, "d.json", {"x1": rows[0], "x2": rows[1]})
    for path in (lines, listed, wrapped, by_id):
        out = load_jsonl(path, "q", "a")
        assert [ex.target for ex in out] == [" Rome", "4"], path
        assert out[0].meta["subject"] == "Italy"
    assert load_jsonl(by_id, "q", "a")[0].meta["id"] == "x1"
    csv = _write(tmp_path, "e.csv", "q,a\nThe capital of Italy is,Rome\n")
    assert load_jsonl(csv, "q", "a")[0] == Example("The capital of Italy is", " Rome")
    assert load_jsonl(listed, "q", "a", space=False)[0].target == "Rome"


def test_counterfact_rome_layout(tmp_path):
    rec = {
        "case_id": 7,
        "requested_rewrite": {
            "prompt": "The mother tongue of {} is",
            "subject": "Danielle Darrieux",
            "relation_id": "P103",
            "target_new": {"str": "English", "id": "Q1860"},
            "target_true": {"str": "French", "id": "Q150"},
        },
        "paraphrase_prompts": ["Danielle Darrieux speaks"],
        "neighborhood_prompts": ["Michel Rocard speaks"],
    }
    out = load_counterfact(_write(tmp_path, "cf.json", [rec]))
    ex = out[0]
    assert ex.prompt == "The mother tongue of Danielle Darrieux is" and ex.target == " French"
    assert ex.meta["paraphrases"] == ["Danielle Darrieux speaks"] and ex.meta["relation_id"] == "P103"
    assert ex.meta["locality"] == [{"prompt": "Michel Rocard speaks", "target": " French"}]
    assert ex.meta["case_id"] == 7 and ex.meta["target_new"] == " English"


def test_pararel_bags_small(tmp_path):
    rel = "P36(capital)"
    bags = [
        [["The capital of France is [MASK] .", "Paris", rel], ["[MASK] is the capital of France.", "Paris", rel]],
        [["The capital of Japan is [MASK] .", "Tokyo", rel], ["[MASK] is the capital of Japan.", "Tokyo", rel]],
    ]
    out = load_pararel_bags(_write(tmp_path, "d.json", bags))
    assert len(out) == 2 and all(len(b) == 1 for b in out)  # mask-first prompts are dropped
    assert out[1][0] == Example("The capital of Japan is", " Tokyo")
    assert out[1][0].meta["subject"] == "Japan" and out[1][0].meta["fact_id"] == 1
    with pytest.raises(ValueError, match="no usable"):
        load_pararel_bags(_write(tmp_path, "e.json", [[["[MASK] is big.", "X", rel]]]))


# ------------------------------------------------------------------------------ errors


def test_missing_file_and_bad_schema(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_known_facts(tmp_path / "nope.json")
    bad = _write(tmp_path, "k.json", [{"prompt": "Rome is in", "subject": "Rome"}])
    with pytest.raises(KeyError, match="attribute"):
        load_known_facts(bad)
    with pytest.raises(KeyError, match="ground_truth"):
        load_counterfact(_write(tmp_path, "c.json", [{"prompt": "p", "subject": "s", "target_new": "x"}]))
    with pytest.raises(KeyError, match="'a'"):
        load_jsonl(_write(tmp_path, "j.jsonl", '{"q": "x"}\n'), "q", "a")
    with pytest.raises(ValueError, match="triples"):
        load_pararel_bags(_write(tmp_path, "p.json", [{"prompt": "x"}]))
    with pytest.raises(ValueError, match="no usable"):
        load_known_facts(_write(tmp_path, "empty.json", []))
    with pytest.raises(ValueError, match="empty"):
        load_jsonl(_write(tmp_path, "blank.jsonl", "\n"), "q", "a")
    with pytest.raises(ValueError, match="line 2"):
        load_jsonl(_write(tmp_path, "broken.jsonl", '{"q": "x", "a": "y"}\n{oops\n'), "q", "a")
    with pytest.raises(ValueError, match="records"):
        load_jsonl(_write(tmp_path, "obj.json", {"a": 1}), "q", "a")


# ------------------------------------------------------------------------------ builtin + filter


def test_builtin_facts():
    facts = builtin_facts()
    assert 10 <= len(facts) <= 16
    assert all(f.meta["subject"] in f.prompt and f.target.startswith(" ") for f in facts)
    assert facts[0].prompt == "The Eiffel Tower is located in the city of" and facts[0].target == " Paris"
    assert len(builtin_facts(3)) == 3


@pytest.fixture(scope="module")
def tiny():
    from capinterp.arch.model import load_model

    return load_model("tiny", threads=1)


def test_facts_known_by(tiny):
    from capinterp.core.tokens import encode, model_bos

    candidates = [
        "Rome is the capital of",
        "Berlin is the capital of",
        "The Eiffel Tower is in the city of",
        "The mother tongue of Tokyo is",
        "Madrid is located in",
        "London was born in",
    ]
    tok = tiny.tokenizer
    prompts, greedy = [], []
    for p in candidates:  # keep prompts whose greedy token decodes to a target that re-encodes to it
        ids = torch.tensor([model_bos(tiny) + tok(p, add_special_tokens=False)["input_ids"]])
        with torch.no_grad():
            o = int(tiny(ids)[0, -1].argmax())
        own = {"target_from": "greedy"}  # the model's own token: it may continue the prompt's last word
        enc = encode(tiny, [Example(p, tok.decode([o]), own)], on_mismatch="skip", max_target_tokens=1)
        if enc and enc[0].target_ids[0] == o:
            prompts.append(p)
            greedy.append(tok.decode([o]))
    assert len(prompts) >= 3
    right = [Example(p, g, {"target_from": "greedy"}) for p, g in zip(prompts, greedy)]
    wrong = Example(prompts[0], " Paris" if greedy[0] != " Paris" else " Rome")
    kept = facts_known_by(tiny, [right[0], wrong, *right[1:]], batch_size=2)  # ragged batches
    assert kept == right
    kept, preds = facts_known_by(tiny, right, return_predictions=True)
    assert [tok.decode([p]) for p in preds] == greedy
    with pytest.raises(ValueError):
        facts_known_by(tiny, [])
    with pytest.raises(TokenizationError):
        facts_known_by(tiny, [Example("Rome is the cap", "ital")])
    assert facts_known_by(tiny, [Example("Rome is the cap", "ital"), *right], on_mismatch="skip") == right
