"""capinterp.data.capabilities: names, sources, splits, fallbacks, tokenization."""

from __future__ import annotations

import pytest

from capinterp.core.tokens import encode
from capinterp.data import capability_sources as cs
from capinterp.data.capabilities import (
    CAPABILITIES,
    SOURCES,
    default_source,
    describe_capability,
    load_capability,
)
from capinterp.data.parsing import is_correct

HAS_SHARED = cs.shared_data_dir() is not None
needs_shared = pytest.mark.skipif(not HAS_SHARED, reason="shared data folder (../shared/data) is absent")
ALWAYS = [(c, "generated") for c in ("add", "sub", "mul", "div")] + [
    ("math_word", "builtin"),
    ("sentiment", "builtin"),
    ("code", "humaneval"),
]
SHARED = [
    ("math_word", "gsm8k"),
    ("math_word", "svamp"),
    ("sentiment", "imdb"),
    ("sentiment", "emotion"),
    ("code", "mbpp"),
]


@pytest.fixture
def no_shared(monkeypatch):
    monkeypatch.setenv("CAPINTERP_DATA", "")
    assert cs.shared_data_dir() is None


def test_names_and_errors():
    assert CAPABILITIES == ("add", "sub", "mul", "div", "math_word", "sentiment", "code")
    with pytest.raises(ValueError, match="add, sub, mul, div, math_word, sentiment, code"):
        load_capability("poetry", 3)
    with pytest.raises(ValueError, match="unknown source"):
        load_capability("add", 3, source="gsm8k")
    with pytest.raises(ValueError, match="split"):
        load_capability("add", 3, split="validation")
    with pytest.raises(ValueError, match="n must be an integer >= 1"):
        load_capability("add", 0)
    for name in CAPABILITIES:
        assert name in describe_capability(name)


@pytest.mark.parametrize("name,source", ALWAYS)
def test_builtin_sources(name, source):
    a = load_capability(name, 12, seed=3, source=source)
    assert len(a) == 12
    assert [e.prompt + e.target for e in a] == [
        e.prompt + e.target for e in load_capability(name, 12, seed=3, source=source)
    ]
    for e in a:
        assert e.meta["capability"] == name and e.meta["source"] == source and e.meta["split"] == "test"
        assert e.target and e.meta["id"]
    if source != "generated":  # another seed draws other records (arithmetic pools are tiny)
        b = load_capability(name, 12, seed=4, source=source)
        assert [e.meta["id"] for e in a] != [e.meta["id"] for e in b]


@pytest.mark.parametrize("name,source", ALWAYS)
def test_splits_are_disjoint(name, source):
    n = 40 if source != "humaneval" else 60
    test = {e.meta["id"] for s in (0, 1) for e in load_capability(name, n, seed=s, split="test", source=source)}
    train = {e.meta["id"] for s in (0, 1) for e in load_capability(name, n, seed=s, split="train", source=source)}
    assert test and train and not test & train


def test_targets_and_answers():
    for e in load_capability("math_word", 20, source="builtin"):
        assert e.target == f" {e.meta['answer']}" and e.prompt.endswith("\nAnswer:")
        assert is_correct(e, e.target + " apples") and not is_correct(e, f" {e.meta['answer'] + 1}")
    labels = {e.target for e in load_capability("sentiment", 60, source="builtin")}
    assert labels == {" positive", " negative"}
    for e in load_capability("sub", 30):
        assert int(e.target) >= 0 and e.prompt.endswith("=")
    for e in load_capability("code", 10):
        assert e.target.startswith("\n") and "\n" not in e.target[1:]


def test_n_too_large_is_a_clear_error():
    with pytest.raises(ValueError, match=r"holds only \d+ records"):
        load_capability("sentiment", 100_000, source="builtin")
    with pytest.raises(ValueError, match=r"holds only \d+ records"):
        load_capability("code", 165)
    assert len(load_capability("div", 300)) == 300  # arithmetic repeats expressions instead


def test_fallback_without_shared_data(no_shared):
    assert default_source("math_word") == "builtin"
    assert default_source("sentiment") == "builtin"
    assert default_source("code") == "humaneval"
    assert load_capability("math_word", 5)[0].meta["source"] == "builtin"
    assert load_capability("sentiment", 5)[0].meta["source"] == "builtin"
    with pytest.raises(FileNotFoundError, match="CAPINTERP_DATA"):
        load_capability("math_word", 5, source="gsm8k")
    assert "(missing)" in describe_capability("sentiment")


def test_tokenizable_by_tiny_model(tiny):
    for name, source in ALWAYS:
        exs = load_capability(name, 8, source=source)
        assert len(encode(tiny, exs)) == 8  # raises TokenizationError on a boundary merge


@needs_shared
@pytest.mark.parametrize("name,source", SHARED)
def test_shared_sources(name, source):
    assert default_source(name) == SOURCES[name][0]
    a = load_capability(name, 20, seed=1, source=source)
    b = load_capability(name, 20, seed=1, split="train", source=source)
    assert len(a) == len(b) == 20
    assert not {e.prompt for e in a} & {e.prompt for e in b}
    assert all(e.meta["source"] == source and e.target.startswith((" ", "def", "import", "class", "from")) for e in a)


@needs_shared
def test_shared_pool_sizes():
    assert len(cs.read_gsm8k("test")) == 1319
    svamp = len(cs.read_svamp("test")) + len(cs.read_svamp("train"))
    assert svamp == 1000
    imdb = cs.read_imdb("test") + cs.read_imdb("train")
    assert len(imdb) == 2499 and max(len(e.prompt.split()) for e in imdb) < 140


@pytest.mark.slow
@pytest.mark.parametrize("model_name", ["gemma3", "smollm2"])
def test_tokenizable_by_packaged_models(model_name, request):
    model = request.getfixturevalue(model_name)
    for name in CAPABILITIES:
        for source in SOURCES[name]:
            if source in {s for _, s in SHARED} and not HAS_SHARED:
                continue
            exs = load_capability(name, 30, source=source)
            assert len(encode(model, exs)) == 30, (name, source)
