"""``estimate(data)``: every localizer predicts its fit's seconds and peak memory before any work."""

from __future__ import annotations

import math

import pytest
import torch

import capinterp as ci
from capinterp.kernels import ig
from capinterp.localizers import QueryLocalization, available, get
from capinterp.localizers.cost import Estimate, probe, weight_bytes
from capinterp.testing import check_facts


@pytest.fixture(scope="module")
def facts(tiny):
    return check_facts(tiny)


def _make(name, model, **kw):
    cls = get(name)
    return cls(model, progress=False, **{**cls.check_params, **kw})


@pytest.mark.parametrize("name", available())
def test_estimate_is_positive_and_finite(name, tiny, facts):
    est = _make(name, tiny).estimate(facts[:2])
    assert isinstance(est, Estimate)
    assert math.isfinite(est.seconds) and est.seconds > 0
    assert est.peak_bytes > weight_bytes(tiny) and est.passes > 0
    assert est.probe_seconds > 0 and sum(est.breakdown.values()) == pytest.approx(est.seconds)
    assert name in str(est) and "s," in str(est)


def test_query_localization_estimate_sums_its_localizer(tiny, facts):
    ql = QueryLocalization(tiny, "kn", progress=False)
    fact = [ci.Example(f.prompt, facts[0].target, f.meta) for f in facts[:2]]  # one answer per fact
    est = ql.estimate([fact, fact])
    one = get("kn")(tiny, progress=False).estimate(fact)
    assert est.passes == 2 * one.passes and est.seconds > one.seconds


@pytest.mark.parametrize("name", available())
@pytest.mark.parametrize("bad", [[], "The capital of France is"])
def test_bad_data_refused_before_any_forward(name, bad, tiny, monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("a forward pass ran before the data was checked")

    monkeypatch.setattr(tiny, "forward", refuse)
    monkeypatch.setattr(tiny, "run_with_hooks", refuse)
    with pytest.raises((ValueError, TypeError)):
        _make(name, tiny).estimate(bad)


@pytest.mark.parametrize("name", available())
def test_estimate_leaves_the_model_as_it_was(name, tiny, facts):
    from capinterp.localizers import cost

    cost._PROBES.pop(tiny, None)  # force the probe to run
    before = {k: v.clone() for k, v in tiny.state_dict().items()}
    grads = [p.requires_grad for p in tiny.parameters()]
    _make(name, tiny).estimate(facts[:2])
    assert all(torch.equal(before[k], v) for k, v in tiny.state_dict().items())
    assert grads == [p.requires_grad for p in tiny.parameters()]
    assert all(p.grad is None for p in tiny.parameters())
    assert str(tiny.cfg.device) == "cpu"


def test_probe_is_cached(tiny):
    assert probe(tiny) is probe(tiny)


def test_cost_scales_with_examples_and_steps(tiny):
    data = ci.data.arithmetic("+", n=8, seed=0)
    cnl = get("cnl")(tiny, progress=False, steps=4, invariance="off")
    half, full = cnl.estimate(data[:4]), cnl.estimate(data)
    assert full.passes == 2 * half.passes
    assert 1.6 < full.seconds / half.seconds < 2.4
    few = get("kn")(tiny, progress=False, steps=4, batch_size=8).estimate(data[:2])
    many = get("kn")(tiny, progress=False, steps=16, batch_size=8).estimate(data[:2])
    assert many.rows > 3 * few.rows and many.seconds > few.seconds
    assert many.breakdown["ig rows"] > 2 * few.breakdown["ig rows"]


@pytest.mark.parametrize("route", ["fast", "loop"])
@pytest.mark.parametrize("name", ["kn", "cnl"])
def test_counted_rows_are_the_rows_the_kernel_runs(name, route, tiny, monkeypatch):
    data = ci.data.arithmetic("+", n=3, seed=1)
    ran = []
    real = ig.ig_scores

    def counting(*a, stats=None, **k):
        stats = {} if stats is None else stats
        out = real(*a, stats=stats, **k)
        ran.append(stats["rows"])
        return out

    monkeypatch.setattr(ig, "ig_scores", counting)
    loc = get(name)(tiny, progress=False, steps=5, route=route, batch_size=7)
    est = loc.estimate(data)
    loc.fit(data)
    assert est.rows == sum(ran) > 0


def test_first_weights_fingerprint_is_counted_once(tiny):
    """A dataset fit fingerprints the weights (an int64 copy of the largest parameter) the first
    time only: the estimate counts that set-up until the digest is cached on the model."""
    from capinterp.core.fingerprint import refresh_fingerprint, weights_digest

    data = ci.data.arithmetic("+", n=2, seed=0)
    dcsn = get("dcsn")(tiny, progress=False)
    refresh_fingerprint(tiny)
    first = dcsn.estimate(data)
    largest = max(p.numel() for p in tiny.parameters())
    assert first.breakdown.get("weights fingerprint", 0) > 0
    assert first.working_bytes >= 8 * largest
    weights_digest(tiny)
    again = dcsn.estimate(data)
    assert "weights fingerprint" not in again.breakdown and again.seconds < first.seconds


def test_probe_calibrates_each_kind_of_pass_on_the_model(tiny):
    pr = probe(tiny)
    assert set(pr.scales) == {"forward", "backward", "direct"}
    assert all(0 < s < math.inf for s in pr.scales.values())


@pytest.mark.parametrize("optimizer, copies", [("sgd", 2), ("adam", 4)])
def test_neft_memory_counts_the_saved_weights_and_gradients(optimizer, copies, tiny):
    """NeFT's fit keeps a copy of every weight to restore, the gradients (and Adam's moments)."""
    data = ci.data.arithmetic("+", n=2, seed=0)
    est = get("neft")(tiny, progress=False, steps=2, optimizer=optimizer).estimate(data)
    assert est.working_bytes > copies * weight_bytes(tiny)
