"""A fitted localizer's ``summary()``: what it located, then the line of the certificate
``ci.certify`` left on it (``certificate_``); IG localizers keep it in their table's attrs."""

from __future__ import annotations

import pytest

import capinterp as ci
from capinterp.data import Example

EXAMPLES = [Example(f"{a}+{b}=", "7") for a, b in [(3, 4), (5, 2), (1, 6), (2, 5)]]


@pytest.fixture(scope="module")
def model():
    return ci.load_model("tiny")


def test_summary_shows_the_certificate_once_certified(model):
    loc = ci.DCSN(model, progress=False)
    with pytest.raises(RuntimeError, match="not fitted"):
        loc.summary()
    loc.fit(EXAMPLES)
    first, second = loc.summary().splitlines()
    assert first == f"DCSN: {len(loc.units_)} neurons located" and second.startswith("not certified")
    cert = ci.certify(model, loc, EXAMPLES, budget=5, tau=0.001)
    assert loc.certificate_ is cert and cert.n_located == len(loc.units_)
    assert loc.summary().splitlines() == [first, cert.summary()]
    other = ci.certify(model, loc.units_, EXAMPLES, budget=3)  # a bare set: nothing to keep it on
    assert loc.certificate_ is cert and other.sampled == 3


def test_ig_localizer_table_carries_the_certificate(model):
    loc = ci.CNL(model, steps=2, progress=False).fit(EXAMPLES)
    assert "certificate" not in loc.summary().attrs
    cert = ci.certify(model, loc, EXAMPLES, budget=4)
    assert loc.summary().attrs["certificate"] == cert.summary()
