"""The experiments' report order is the declared list ``ORDER``, not the order of imports."""

from __future__ import annotations

from capinterp import experiments
from capinterp.experiments import EXPERIMENTS, ORDER
from capinterp.experiments.base import experiment


def test_every_registered_experiment_is_in_the_order_exactly_once():
    assert len(ORDER) == len(set(ORDER)), [n for n in ORDER if ORDER.count(n) > 1]
    assert set(ORDER) == set(EXPERIMENTS), set(ORDER) ^ set(EXPERIMENTS)
    assert list(EXPERIMENTS) == list(ORDER)


def test_the_order_does_not_depend_on_registration(monkeypatch):
    monkeypatch.setattr(experiments, "ORDER", tuple(reversed(ORDER)))
    saved = dict(EXPERIMENTS)
    try:
        experiment("zz_unlisted", "an experiment missing from ORDER")(lambda ctx: None)
        experiments._put_in_order()
        assert list(EXPERIMENTS) == [*reversed(ORDER), "zz_unlisted"]
    finally:
        EXPERIMENTS.clear()
        EXPERIMENTS.update(saved)
