"""IGConfig: one frozen value for the IG settings; its presets; the localizers' default path is PAPERS."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import capinterp as ci
from capinterp.core.example import Example
from capinterp.core.tokens import encode
from capinterp.kernels import sequential
from capinterp.kernels.ig import ig_scores
from capinterp.kernels.ig_config import ADAPTIVE, CLOSED_FORM, GAUSS_LEGENDRE, PAPERS, IGConfig
from capinterp.kernels.quadrature import quadrature

EXAMPLES = [Example("3+4=", "7"), Example("12*3=", "36"), Example("8-5=", "3")]


def test_frozen_and_hashable():
    cfg = IGConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.steps = 5  # type: ignore[misc]
    assert hash(cfg) == hash(IGConfig()) and cfg == IGConfig()
    changed = cfg.replace(steps=5, route="loop")
    assert (changed.steps, changed.route, cfg.steps, cfg.route) == (5, "loop", 20, "fast")
    with pytest.raises(ValueError, match="unknown route"):
        cfg.replace(route="slow")  # a copy is validated again


@pytest.mark.parametrize(
    "kw, match",
    [
        (
            dict(rule="Gauss"),
            r"unknown rule 'Gauss'; choose one of right, left, linspace, midpoint, trapezoid, gauss, adaptive",
        ),
        (dict(rule=None), "unknown rule None"),
        (dict(positions="answers"), "unknown positions 'answers'"),
        (dict(steps=True), "steps must be an integer >= 1"),
        (dict(batch_size=1.5), "batch_size must be an integer >= 1"),
        (dict(tol=float("inf")), "tol must be a finite number > 0"),
        (dict(completeness_tol=0), "completeness_tol must be a finite number > 0"),
        (dict(invariance=True), "unknown invariance True"),
    ],
)
def test_validation_names_the_field(kw, match):
    with pytest.raises(ValueError, match=match):
        IGConfig(**kw)


def test_presets_are_the_papers_settings():
    # Dai et al. 2022 Sec. 3.1 / Huang et al. 2025 Eq. 7: alpha_k = k/m, weights 1/m, m = 20, every node integrated
    assert (PAPERS.rule, PAPERS.steps, PAPERS.invariance) == ("right", 20, "off")
    alphas, weights = quadrature(PAPERS.steps, PAPERS.rule)
    assert torch.equal(alphas, torch.tensor([k / 20 for k in range(1, 21)], dtype=torch.float64))
    assert torch.equal(weights, torch.full((20,), 1 / 20, dtype=torch.float64))
    assert (PAPERS.positions, PAPERS.objective, PAPERS.route) == ("answer", "prob", "fast")
    assert CLOSED_FORM == PAPERS.replace(invariance="auto") == IGConfig()  # the default
    assert (GAUSS_LEGENDRE.rule, GAUSS_LEGENDRE.steps) == ("gauss", 10)
    assert (ADAPTIVE.rule, ADAPTIVE.tol, ADAPTIVE.max_steps, ADAPTIVE.adaptive) == ("adaptive", 1e-3, 256, True)
    assert not PAPERS.adaptive
    assert {ci.PAPERS, ci.CLOSED_FORM, ci.GAUSS_LEGENDRE, ci.ADAPTIVE} == {
        PAPERS,
        CLOSED_FORM,
        GAUSS_LEGENDRE,
        ADAPTIVE,
    }
    assert ci.kernels.IGConfig is IGConfig is ci.IGConfig


def test_localizer_defaults_are_the_presets(tiny):
    assert ci.CNL(tiny)._ig_config(64) == CLOSED_FORM
    assert ci.KN(tiny)._ig_config() == CLOSED_FORM.replace(positions="last_prompt")
    assert ci.SIG(tiny)._ig_config() == sequential.DEFAULT == PAPERS.replace(positions="prompt")
    assert ci.CNL(tiny, rule="gauss", steps=10)._ig_config(64) == GAUSS_LEGENDRE


def test_kernels_refuse_configs_of_the_other_kernel(tiny):
    enc = encode(tiny, EXAMPLES[:1])
    with pytest.raises(ValueError, match="positions 'prompt'"):
        ig_scores(tiny, enc, PAPERS.replace(positions="prompt"))
    with pytest.raises(ValueError, match="positions 'answer' for SIG"):
        sequential.sig_scores(tiny, enc[0], PAPERS)
    with pytest.raises(ValueError, match="invariance must be 'off'"):
        sequential.sig_scores(tiny, enc[0], CLOSED_FORM.replace(positions="prompt"))
    with pytest.raises(TypeError, match="IGConfig"):
        ig_scores(tiny, enc, dict(steps=3))  # type: ignore[arg-type]


@pytest.mark.filterwarnings("ignore:.*completeness error")
def test_papers_preset_is_the_localizers_default_path_bit_for_bit(tiny):
    """ig_scores(config=PAPERS) gives exactly the scores of CNL's and KN's default fits (the tiny
    model is not scale invariant, so the default's closed form never applies)."""
    cnl = ci.CNL(tiny, progress=False).fit(EXAMPLES)
    scores = ig_scores(tiny, encode(tiny, EXAMPLES), PAPERS)
    total = torch.zeros_like(cnl.sums_.sum)
    for row in scores:
        total += row.double()
    assert scores.abs().max() > 0
    assert torch.equal(cnl.sums_.sum, total)

    kn = ci.KN(tiny, progress=False).fit(EXAMPLES)
    items = encode(tiny, EXAMPLES, max_target_tokens=1)
    assert torch.equal(kn.prompt_scores_, ig_scores(tiny, items, PAPERS.replace(positions="last_prompt")))

    sig = ci.SIG(tiny, steps=3, progress=False).fit(EXAMPLES[:1])
    want = sequential.sig_scores(tiny, items[0], sequential.DEFAULT.replace(steps=3))
    assert torch.equal(sig.prompt_scores_[0], want)
