"""Property-based tests (hypothesis): generated bad and edge inputs for the public API.

The contract checked everywhere: a call either raises ValueError / TypeError *before any model
work* (no forward pass ran: a pre-hook on the model counts them) or returns a correct result.
``pytest tests/test_properties.py --hypothesis-show-statistics`` prints how many cases each
property tried (docs/guarantees.md quotes the totals).
"""

from __future__ import annotations

import inspect
import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import capinterp as ci
from capinterp.arch.model import model_meta
from capinterp.core import validate
from capinterp.core.example import Example, as_examples, glued_words
from capinterp.core.tokens import TokenizationError
from capinterp.testing import BAD_EXAMPLES, bad_examples, contract_params
from capinterp.units import metrics
from capinterp.units.neurons import NeuronScores, NeuronSet, load

FAST = settings(
    max_examples=200, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
MODEL = settings(
    max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)

anything = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-10, 10**6),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=5),
    st.lists(st.integers(), max_size=2),
    st.just(np.float32(0.5)),
    st.just(torch.tensor(2)),
)


class Forwards:
    """Counts forward passes of a model (a pre-hook on its embedding, which every pass runs)."""

    def __init__(self, model) -> None:
        self.n = 0
        self.handle = model.embed.register_forward_pre_hook(self._count)  # every forward embeds

    def _count(self, *_):
        self.n += 1

    def close(self) -> None:
        self.handle.remove()


@pytest.fixture
def forwards(tiny):
    f = Forwards(tiny)
    yield f
    f.close()


# ----------------------------------------------------------------------------- the validators
@FAST
@given(anything)
def test_positive_int_contract(value):
    try:
        out = validate.positive_int("n", value)
    except (ValueError, TypeError) as err:
        assert str(err).startswith("n must be") and "got" in str(err)
    else:
        assert type(out) is int and out >= 1 and out == value and not isinstance(value, bool)


@FAST
@given(anything, st.floats(-5, 5), st.booleans())
def test_finite_float_contract(value, low, low_open):
    try:
        out = validate.finite_float("x", value, low=low, low_open=low_open)
    except (ValueError, TypeError) as err:
        assert str(err).startswith("x must be") and "got" in str(err)
    else:
        assert isinstance(out, float) and math.isfinite(out) and (out > low if low_open else out >= low)


item = st.one_of(
    st.text(max_size=4),
    st.tuples(st.text(max_size=4), st.text(max_size=3)),
    st.fixed_dictionaries({"prompt": st.one_of(st.text(max_size=4), st.none()), "target": st.text(max_size=3)}),
    st.integers(),
    st.none(),
    st.builds(Example, st.text(max_size=4), st.text(max_size=3)),
)


@FAST
@given(
    st.one_of(
        st.lists(item, max_size=4),
        st.text(max_size=4),
        st.binary(max_size=4),
        st.integers(),
        st.dictionaries(st.text(max_size=2), st.text(max_size=2), max_size=2),
    )
)
def test_as_examples_contract(data):
    try:
        out = as_examples(data)
    except TokenizationError as err:  # an explicit empty or blank target, or one glued onto the prompt's last word
        assert "empty target" in str(err) or "glues onto the prompt's last word" in str(err)
    except (ValueError, TypeError) as err:
        assert "item" in str(err) or "expected" in str(err) or "wrap it" in str(err)
    else:
        assert isinstance(data, list) and len(out) == len(data)
        assert all(isinstance(e, Example) and e.prompt and isinstance(e.target, str) for e in out)
        assert all(e.target.strip() or e.wants_greedy for e in out)  # blank only for a bare prompt
        assert not any(glued_words(e.prompt, e.target) for e in out)  # never two words glued into one


# ----------------------------------------------------------------------------- the localizers
# Every registered localizer (entry points included), read from the registry: a new one is picked
# up with no edit here. QueryLocalization is no registered localizer but takes data the same way.
NAMES = ci.localizers.available()


def _make(name):
    """name -> a constructor of that localizer with the contract's small parameters (a function of
    (model, overrides)); "ql": QueryLocalization."""
    if name == "ql":
        return lambda m, v: ci.QueryLocalization(m, progress=False, **v)
    cls = ci.localizers.get(name)
    return lambda m, v: cls(m, **{**contract_params(cls), **v})


def _numeric_params(name):
    """The keyword hyper-parameters with a number as default, each with the annotation of the most
    derived constructor that takes it (what else it may be: ``None``, a ``str`` such as "auto")."""
    cls = ci.QueryLocalization if name == "ql" else ci.localizers.get(name)
    out = {}
    for klass in cls.__mro__[:-1]:
        for p in inspect.signature(klass.__init__).parameters.values():
            numeric = isinstance(p.default, (int, float)) and not isinstance(p.default, bool)
            if p.kind == p.KEYWORD_ONLY and p.name not in out and (numeric or p.default is None):
                out[p.name] = str(p.annotation)
    return {k: a for k, a in out.items() if "int" in a or "float" in a}


# One test per localizer (its own examples; `-k NAME` selects it: tests/test_new_localizer.py does).
PER_NAME = settings(MODEL, max_examples=12)


@pytest.mark.parametrize("name", [*NAMES, "ql"])
@PER_NAME
@given(data=st.data())
def test_constructors_refuse_bad_hyper_parameters_before_work(tiny, forwards, name, data):
    params = _numeric_params(name)
    key = data.draw(st.sampled_from(sorted(params)))
    value = data.draw(anything)
    before = forwards.n
    try:
        loc = _make(name)(tiny, {key: value})
    except (ValueError, TypeError) as err:
        assert key in str(err) or "must" in str(err)
    else:  # accepted: the value must be a sane one of a declared type
        assert value is not None or "None" in params[key], (key, value)
        if isinstance(value, float):
            assert math.isfinite(value)
        assert not isinstance(value, str) or "str" in params[key], (key, value)
        assert not isinstance(value, list)
        assert loc is not None
    assert forwards.n == before  # nothing ran


bad_data = st.one_of(
    st.text(max_size=6),
    st.binary(max_size=4),
    st.integers(),
    st.just([]),
    st.lists(
        st.one_of(st.just(("", "2")), st.just({"prompt": "", "target": "1"}), st.integers(), st.none()),
        min_size=1,
        max_size=3,
    ).map(lambda bad: [("1+1=", "2")] + bad),
)


@pytest.mark.parametrize("name", [*NAMES, "evaluate"])
@PER_NAME
@given(data=bad_data)
def test_fit_refuses_bad_data_before_work(tiny, forwards, name, data):
    before = forwards.n
    with pytest.raises((ValueError, TypeError)):
        if name == "evaluate":
            ci.evaluate(tiny, data)
        else:
            _make(name)(tiny, {}).fit(data)
    assert forwards.n == before


prompt = st.text(alphabet="0123456789+=ab ", min_size=1, max_size=6).filter(lambda p: p[-1] in "+= ")


@settings(max_examples=25, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(prompt, st.sampled_from(["1", "2", "x"])), min_size=1, max_size=3))
def test_dcsn_on_valid_data_gives_finite_scores(tiny, data):
    loc = ci.DCSN(tiny, progress=False).fit(data)
    s = loc.scores_.scores
    assert s.shape == (tiny.cfg.n_layers, tiny.cfg.d_mlp) and torch.isfinite(s).all()
    assert loc.scores_.meta["n_samples"] == len(data)


# ----------------------------------------------------------------------------- interventions
@MODEL
@given(anything)
def test_scale_factor_contract(tiny, forwards, factor):
    ns = NeuronScores(torch.rand(tiny.cfg.n_layers, tiny.cfg.d_mlp), model_meta(tiny)).top_k(2)
    try:
        with ci.scale(tiny, ns, factor):
            pass
    except (ValueError, TypeError) as err:
        assert "factor" in str(err)
    else:
        assert math.isfinite(float(factor)) and not isinstance(factor, bool)
    assert forwards.n == 0


# ----------------------------------------------------------------------------- files
@FAST
@given(st.integers(1, 4), st.integers(1, 6), st.integers(0, 10**6), st.integers(0, 7))
def test_saved_scores_round_trip_or_fail_loudly(tmp_path_factory, n_layers, d_mlp, pos, bit):
    p = tmp_path_factory.mktemp("f") / "s.capi"
    scores = NeuronScores(torch.randn(n_layers, d_mlp))
    scores.save(p)
    assert torch.equal(load(p).scores, scores.scores)
    raw = bytearray(p.read_bytes())
    raw[pos % len(raw)] ^= 1 << bit  # one flipped bit anywhere in the file
    p.write_bytes(bytes(raw))
    try:
        back = load(p)
    except (ValueError, FileNotFoundError):
        return
    # a flip the reader tolerates (JSON whitespace / key order) must leave the data intact
    assert isinstance(back, NeuronScores) and torch.equal(back.scores, scores.scores)


# ----------------------------------------------------------------------------- metrics
masks = st.integers(0, 2**12 - 1).map(lambda x: torch.tensor([(x >> i) & 1 for i in range(12)], dtype=torch.bool))


@FAST
@given(masks, masks)
def test_metrics_are_bounded_and_symmetric(a, b):
    A, B = NeuronSet(a.view(3, 4)), NeuronSet(b.view(3, 4))
    for fn in (metrics.overlap, metrics.iou, metrics.cohesion):
        v = fn(A, B)
        assert 0.0 <= v <= 1.0 and v == fn(B, A)
    assert metrics.iou(A, A) == 1.0


# ----------------------------------------------------------------------------- one validation layer
# Issue 31: no localizer, intervention or editor may accept an input that another one refuses.
FACT_PROMPT, PARAPHRASE, SUBJECT = (
    "The Eiffel Tower is in the city of",
    "The Eiffel Tower stands in the city of",
    "Eiffel Tower",
)


def _facts(**change):
    return [
        {
            "prompt": p,
            "target": " Paris",
            "subject": SUBJECT,
            **{k: v(p) if callable(v) else v for k, v in change.items()},
        }
        for p in (FACT_PROMPT, PARAPHRASE)
    ]


ROME_TEXTS = [f"Story {i}: the river runs past the old mill near the bridge today." for i in range(8)]


def _entry_points(model):
    """name -> call(queries): every registered localizer's fit (built with the contract's
    parameters, capinterp.testing.contract_params), QL, the interventions that take data, the editors."""
    out = {f"{name}.fit": _make(name)(model, {}).fit for name in NAMES}
    ql = ci.QueryLocalization(model, progress=False)
    out["QueryLocalization.fit"] = lambda q: ql.fit([q] if q else [])
    out["evaluate"] = lambda q: ci.evaluate(model, q)
    out["finetune"] = lambda q: ci.finetune(model, q, arms=("full",), progress=False)
    out["edit_knowledge"] = lambda q: ci.edit_knowledge(model, q, "union", "erase")
    out["rome_edit"] = lambda q: ci.rome_edit(
        model,
        Example(q[0]["prompt"], q[0]["target"], {"subject": SUBJECT}),
        " Rome",
        layer=0,
        texts=ROME_TEXTS,
        steps=1,
    )
    return out


@pytest.mark.parametrize("bad", BAD_EXAMPLES)
def test_every_entry_point_refuses_the_same_bad_input_alike_before_work(tiny, forwards, bad):
    """The bad inputs of the data contract (capinterp.testing.bad_examples: the exception every entry
    point raises), for the one fact every entry point below takes."""
    queries, expected = bad_examples(tiny, _facts())[bad]
    raised = {}
    for name, call in _entry_points(tiny).items():
        if name == "rome_edit" and not queries:
            continue  # an editor of one fact has no dataset to be empty
        before = forwards.n
        try:
            call(queries)
        except (ValueError, TypeError) as err:
            raised[name] = type(err)
        else:
            raised[name] = None
        assert forwards.n == before, f"{name} ran the model before refusing {bad}"
    assert {n: t for n, t in raised.items() if t is not expected} == {}, f"{bad}: expected {expected.__name__}"
    assert len(raised) == len(NAMES) + 4 + bool(queries)  # the localizers, QL, evaluate, finetune, the editors


@FAST
@given(st.text(alphabet=" \t\nab7", max_size=4))
def test_a_target_is_refused_exactly_when_it_is_blank(target):
    try:
        (ex,) = as_examples([("3+4=", target)])
    except TokenizationError as err:
        assert not target.strip() and "empty target" in str(err)
    else:
        assert target.strip() and ex.target == target


#: The entry points that fill a bare prompt's target with the model's greedy next token: the
#: localizers that declare it (capinterp.testing.data_checks.check_bare_prompt checks each one).
FILL_GREEDY = {f"{name}.fit" for name in ci.localizers.available(fills_greedy=True)}


def test_a_bare_prompt_is_the_greedy_token_or_the_same_error(tiny, forwards):
    """A bare prompt (no target) is the one documented exception: the neuron localizers fill in the
    greedy token; every entry point that needs the answer refuses it with the same TokenizationError."""
    bare = [{k: v for k, v in q.items() if k != "target"} for q in _facts()]
    refused = {}
    for name, call in _entry_points(tiny).items():
        if name in FILL_GREEDY or name == "rome_edit":  # rome_edit's target is new_target
            continue
        before = forwards.n
        with pytest.raises(TokenizationError, match="empty target") as err:
            call(bare)
        refused[name] = type(err.value)
        assert forwards.n == before, name
    assert set(refused) == {f"{n}.fit" for n in ci.localizers.available()} - FILL_GREEDY | {
        "QueryLocalization.fit",
        "evaluate",
        "finetune",
        "edit_knowledge",
    }
    calls = _entry_points(tiny)
    for name in sorted(FILL_GREEDY):  # and a filler really takes them
        calls[name](bare)
