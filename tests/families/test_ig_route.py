"""IG's fast route on the families that needed care, against IG written by hand on plain
transformers; and the fallback, where it happens, warns once naming the family."""

from __future__ import annotations

import warnings
import weakref

import pytest
import torch


def _fast(model, items):
    from capinterp.kernels.ig import ig_scores
    from capinterp.kernels.ig_config import IGConfig
    from capinterp.testing.family_checks.neurons import STEPS

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = ig_scores(
            model, items, IGConfig(steps=STEPS, rule="right", positions="last_prompt", route="fast", invariance="off")
        )
    return got, [str(w.message) for w in caught if "route" in str(w.message)]


def test_gpt_neo_local_window_runs_rows_in_the_batch_past_the_window():
    """GPT-Neo's local layers window by absolute position (4 here): a prompt of 24 tokens and
    11 rows per call is far past it in the folded layout, and the scores still equal hand IG."""
    from capinterp.arch.family import family_of
    from capinterp.core.example import Example
    from capinterp.core.tokens import encode
    from capinterp.kernels.prefix import _batch_layout
    from capinterp.testing.family_checks._models import load_pair, plain_hf
    from capinterp.testing.family_checks.neurons import _close, _ig_ref

    _, _, model = load_pair("gpt_neo")
    assert family_of(model).module_window == 4 and _batch_layout(model)
    text = "The Eiffel Tower is in the city of Paris . Rome is the capital of Italy . Berlin is the capital of"
    items = encode(model, [Example(prompt=text, target=" Germany")])
    assert len(items[0].prompt_ids) > 4 * family_of(model).module_window
    got, routes = _fast(model, items)
    assert not routes, routes
    ref = plain_hf("gpt_neo")
    _close(got[0], _ig_ref(ref, items[0], family_of(model).d_mlp), "gpt_neo fast IG", ref)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_folded_layout_elsewhere(family):
    from capinterp.kernels.prefix import _batch_layout
    from capinterp.testing.family_checks._models import load_pair

    assert not _batch_layout(load_pair(family)[2])


def test_fallback_warns_once_naming_the_family(monkeypatch):
    """Where the self-check fails, the one warning names the family and the slower route."""
    from capinterp.kernels import ig
    from capinterp.kernels import prefix as _prefix
    from capinterp.testing.family_checks._models import load_pair
    from capinterp.testing.family_checks.neurons import _data

    _, _, model = load_pair("bloom")
    monkeypatch.setattr(ig, "_STAIR_OK", weakref.WeakKeyDictionary())
    monkeypatch.setattr(_prefix, "stair_supported", lambda model, run: False)
    _, items = _data(model)
    got, routes = _fast(model, items)
    again, routes2 = _fast(model, items[:1])
    assert len(routes) == 1 and not routes2, (routes, routes2)
    assert "bloom" in routes[0] and "route='prefix'" in routes[0]
    assert torch.isfinite(got).all() and torch.equal(again[0], got[0])
