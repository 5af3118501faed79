"""Gemma 3n's text model (AltUp's four residual streams): what the family matrix does not show by itself.

The matrix row ``gemma3n_text`` checks every method against plain transformers. Here: the block output
is the whole residual (hook_resid_post is one stream of four, and restoring it alone is not restoring the
state), the AltUp collapse the fast route ends with equals transformers' final-norm input, and the
refusals: circuits, DCSN's folded norms (on DeepSeek-V4's streams too), FFN widths that differ by layer.
"""

from __future__ import annotations

import warnings

import pytest
import torch

import capinterp as ci
from capinterp.arch.family import UnsupportedFamily, family_of
from capinterp.arch.forward import batch_first, collapse_streams
from capinterp.arch.tiny import tiny_hf
from capinterp.core.example import Example
from capinterp.kernels.tracing import trace_hook
from capinterp.testing.family_checks._models import load_pair

IDS = torch.tensor([[1, 5, 9, 30, 7, 2]])


def test_the_residual_is_every_altup_stream():
    _, _, model = load_pair("gemma3n_text")
    assert family_of(model).altup_streams == 4
    assert trace_hook(model, "resid", 1) == "blocks.1.hook_out"
    with torch.no_grad():
        _, cache = model.run_with_cache(
            IDS, names_filter=lambda n: n.startswith("blocks.1.hook_") or n == "ln_final.hook_in"
        )
    streams = cache["blocks.1.hook_out"]
    assert streams.shape == (4, 1, IDS.shape[1], int(model.cfg.d_model))
    assert cache["blocks.1.hook_resid_post"].shape == (1, IDS.shape[1], int(model.cfg.d_model))  # one of them
    assert torch.equal(batch_first(model, streams)[0, :, 0], cache["blocks.1.hook_resid_post"][0])  # the active one


def test_altup_collapse_is_the_final_norms_input():
    """:func:`collapse_streams` on the last block's output (batch first) is what transformers' final norm reads."""
    _, _, model = load_pair("gemma3n_text")
    L = int(model.cfg.n_layers)
    with torch.no_grad():
        _, cache = model.run_with_cache(
            IDS, names_filter=lambda n: n in (f"blocks.{L - 1}.hook_out", "ln_final.hook_in")
        )
        got = collapse_streams(model, batch_first(model, cache[f"blocks.{L - 1}.hook_out"]))
    want = cache["ln_final.hook_in"]
    assert got.shape == want.shape and (got - want).abs().max() <= 1e-5 * want.abs().max()


@pytest.mark.parametrize("family", ["gemma3n_text", "deepseek_v4"])
def test_dcsn_folded_norms_refused_on_several_streams(family):
    _, _, model = load_pair(family)
    with pytest.raises(UnsupportedFamily, match="norms='fold'.*residual streams"):
        ci.DCSN(model, norms="fold", progress=False).fit([Example("Rome is the capital of", " Italy")])


def test_ffn_widths_that_differ_by_layer_refused_at_load():
    hf, tok = tiny_hf("gemma3n_text", intermediate_size=[96, 64, 96])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(UnsupportedFamily, match=r"gemma3n_text: FFN widths differ across layers \(\[64, 96\]\)"):
            ci.load_model(hf, tokenizer=tok)


def test_causal_trace_over_a_cached_prefix_equals_full_runs(monkeypatch):
    """With a window wider than the prompt the traced rows run over the corrupted prefix's KV cache
    (AltUp streams restored at the block output); the grids equal full runs'."""
    from capinterp.kernels import tracing
    from capinterp.localizers.causal_trace import CausalTrace

    cached_rows: list[bool] = []
    rows = tracing.Runner.rows

    def spy(self, sample_r, spec, t0, cache):
        cached_rows.append(cache is not None)
        return rows(self, sample_r, spec, t0, cache)

    monkeypatch.setattr(tracing.Runner, "rows", spy)

    hf, tok = tiny_hf("gemma3n_text", sliding_window=64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = ci.load_model(hf, tokenizer=tok)
    facts = [{"prompt": "3+4=7 The Eiffel Tower is in", "subject": "The Eiffel Tower"}]
    kw = dict(samples=3, window=2, noise=3.0, seed=1, top_k=1, progress=False)
    cached = CausalTrace(model, reuse_prefix=True, **kw).fit(facts).per_prompt_[0]["probs"]
    assert cached_rows and all(cached_rows), "the rows did not run over the cached prefix"
    full = CausalTrace(model, reuse_prefix=False, **kw).fit(facts).per_prompt_[0]["probs"]
    for kind in ("resid", "mlp", "attn"):
        assert (cached[kind] - full[kind]).abs().max() <= 1e-6, kind
