"""scripts/certify_budget.py: every method's path (locate, certify, the rows against B) on the tiny model."""

from __future__ import annotations

import numpy as np
import pytest
from script_module import load_script

import capinterp as ci
from capinterp.data import Example
from capinterp.interventions.certify_bounds import bounds

FACTS = [
    Example("Rome is the capital of", " Italy", {"subject": "Rome"}),
    Example("Berlin is the capital of", " Germany", {"subject": "Berlin"}),
]
PROBLEMS = [Example("7 - 3 =", " 4"), Example("9 - 5 =", " 4")]
KINDS = {"dcsn": "neuron", "cnl": "neuron", "kn": "neuron", "tracing": "layer", "eap-ig": "edge"}


@pytest.fixture(scope="module")
def script():
    return load_script("certify_budget")


@pytest.fixture(scope="module")
def model():
    return ci.load_model("tiny", threads=1)


def _args(script, budget: int):
    argv = ["--budget", str(budget), "--tau", "1e-4", "--steps", "2", "--samples", "2", "--top-layers", "1"]
    return script.parser().parse_args([*argv, "--top-edges", "20"])


@pytest.mark.parametrize("method", sorted(KINDS))
def test_each_method_certifies_its_own_unit_kind(script, model, method):
    data = PROBLEMS if method == "cnl" else FACTS
    c = script.measure(model, method, data, _args(script, 40))
    assert c.kind == KINDS[method] and c.strata == (c.n_outside,)
    assert c.sampled == min(40, c.n_outside)
    rows = script.budget_rows(c)
    sizes = [r[0] for r in rows]
    first = 2 if c.kind == "layer" else 16
    assert sizes == [b for b in (first, 2 * first, 4 * first) if b < c.sampled] + [c.sampled]
    # the last row is the certificate itself; every row is the bound of the draw's first b patches
    assert rows[-1][1:3] == (c.count_bound, pytest.approx(c.total_bound))
    x = np.maximum(c.sampled_effects, 0.0)
    for b, count, total, estimate in rows:
        r = bounds([c.n_outside], [b], [x[:b]], c.tau, c.delta)
        assert (count, total, estimate) == (r.count_bound, r.total_bound, r.total_estimate)
        assert count >= int((x[:b] > c.tau).sum())


def test_a_layer_set_is_certified_exactly_at_its_size(script, model):
    c = script.measure(model, "tracing", FACTS, _args(script, 64))
    x = np.maximum(c.sampled_effects, 0.0)
    assert c.sampled == c.n_outside == 4 - c.n_located
    assert c.count_bound == int((x > c.tau).sum()) and c.total_bound == pytest.approx(x.sum())


def test_report_prints_the_certificate_and_the_table(script, model):
    text = script.report(model, "kn", FACTS, _args(script, 20), "tiny")
    head, _, *table = text.splitlines()
    assert head.startswith("tiny kn: 2 facts; certify (neurons): ")
    assert table[:2] == ["| B | count bound | total bound | total estimate |", "| --- | --- | --- | --- |"]
    assert [row.split(" | ")[0] for row in table[2:]] == ["| 16", "| 20"]


def test_unknown_method_is_refused_before_loading_a_model(script, capsys):
    with pytest.raises(SystemExit):
        script.main(["--model", "no-such-model", "--method", "cnl,rome"])
    assert "unknown method(s) ['rome']" in capsys.readouterr().err
    with pytest.raises(ValueError, match="unknown method"):
        script.locate(None, "rome", [])
