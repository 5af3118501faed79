"""The dataset-localizer example of docs/extending.md runs as printed and meets the contract.

The page says the example needs one method; this runs its code block as written, fits it on the
tiny model, asks it for an estimate, and runs the whole localizer contract on it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

import capinterp as ci
from capinterp.localizers import base
from capinterp.testing import check_localizer

PAGE = Path(__file__).resolve().parents[1] / "docs" / "extending.md"


def _example_source() -> str:
    blocks = re.findall(r"```python\n(.*?)```", PAGE.read_text(), re.S)
    found = [b for b in blocks if "class Activation(DatasetNeuronLocalizer)" in b]
    assert len(found) == 1, "docs/extending.md lost its Activation example"
    return found[0]


@pytest.fixture
def activation(monkeypatch):
    monkeypatch.setattr(base, "_REGISTRY", dict(base._REGISTRY))  # the example registers a name
    namespace: dict = {}
    exec(compile(_example_source(), str(PAGE), "exec"), namespace)  # the page's own code
    return namespace["Activation"]


def test_the_example_fits_estimates_and_meets_the_contract(activation, tiny):
    data = [("The capital of France is", " Paris"), ("The capital of Spain is", " Madrid"), ("One plus one is", " two")]
    loc = ci.localizers.get("activation")(tiny, sigma=1.0, device="cpu", progress=False)
    estimate = loc.estimate(data)
    assert estimate.seconds > 0 and estimate.passes >= 1
    loc.fit(data)
    assert loc.scores_.shape == (tiny.cfg.n_layers, tiny.cfg.d_mlp) and len(loc.neurons_) > 0
    assert loc.scores_.meta["params"]["absolute"] is False
    check_localizer(activation, model=tiny)
    auto = ci.localizers.get("activation")(tiny, sigma=1.0, batch_size="auto", device="cpu", progress=False).fit(data)
    assert torch.equal(auto.scores_.scores, loc.scores_.scores)
