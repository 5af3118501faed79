"""Causal tracing's stair (capinterp.kernels._trace_stair) against a slow, obvious reference.

The reference runs one full forward per restoration, the noise and the clean states written in by
plain hooks; the stair starts each row at its window's first layer over the corrupted copies' recorded
run. Three families (a Llama, GPT-2, Gemma 3 with 4-token sliding windows and soft-capped logits), all
three kinds, several windows, parameters frozen and trainable.
"""

from __future__ import annotations

import functools
from types import SimpleNamespace

import pytest
import torch

from capinterp.arch.model import load_model
from capinterp.arch.tiny import tiny_hf
from capinterp.core.tokens import model_bos
from capinterp.kernels import tracing
from capinterp.kernels.tracing import (
    KINDS,
    Runner,
    embed_hook,
    make_noise,
    present_layers,
    stair_restoration_probs,
    state_view,
    subject_token_range,
    trace_hook,
)

PROMPT, SUBJECT = "The Eiffel Tower is in the city of", "Eiffel Tower"
SAMPLES = 3
WINDOWS = (1, 4)
# (family, parameters frozen): each family once, frozen and trainable both on the Llama
CASES = [("llama", True), ("llama", False), ("gpt2", True), ("gemma3_text", False)]


@functools.cache
def _load(family: str):
    if family == "llama":
        return load_model("tiny", threads=1)
    hf, tok = tiny_hf(family)
    return load_model(hf, tokenizer=tok, threads=1)


def _setup(model):
    """ids, subject span, the clean states of every kind, the clean answer o, and the noise."""
    tok = model.tokenizer
    bare = tok(PROMPT, add_special_tokens=False)["input_ids"]
    nb = len(model_bos(model))
    ids = torch.tensor([model_bos(model) + bare])
    span = subject_token_range(tok, PROMPT, SUBJECT, bare, offset=nb)
    present = present_layers(model, KINDS)
    clean: dict = {}

    def keeper(key):
        def keep(act, hook):
            clean[key] = state_view(model, key[0], act)[0].detach().clone()

        return keep

    with torch.no_grad():
        hooks = [(trace_hook(model, k, l), keeper((k, l))) for k in KINDS for l in present[k]]
        logits = model.run_with_hooks(ids, fwd_hooks=hooks)
    o = int(logits[0, -1].argmax())
    emb = model.embed.W_E if hasattr(model.embed, "W_E") else None
    std = 3.0 * float(emb.detach().std()) if emb is not None else 0.3
    noise = make_noise(1, SAMPLES, span[1] - span[0], int(model.cfg.d_model), std)
    return ids, span, clean, o, noise, present


def _reference(model, ids, span, clean, o, noise, kind, window, present):
    """[T - s0, L] restored p(o), one full forward per restoration, everything by plain hooks."""
    s0, s1 = span
    T, L = ids.shape[1], int(model.cfg.n_layers)

    def corrupt(act, hook):
        act = act.clone()
        act[:, s0:s1] += noise.to(act.dtype)
        return act

    def put(key, t):
        def f(act, hook):
            state_view(model, key[0], act)[:, t] = clean[key][t]
            return act

        return f

    out = torch.empty(T - s0, L)
    half, upper = window // 2, -(-window // 2)
    for t in range(s0, T):
        for l in range(L):
            js = [l] if kind == "resid" else [j for j in present[kind] if l - half <= j < l + upper]
            hooks = [(embed_hook(model), corrupt)] + [(trace_hook(model, kind, j), put((kind, j), t)) for j in js]
            with torch.no_grad():
                logits = model.run_with_hooks(ids.expand(SAMPLES, -1), fwd_hooks=hooks)
            out[t - s0, l] = logits[:, -1].float().softmax(-1)[:, o].mean()
    return out


@pytest.mark.parametrize("family,frozen", CASES, ids=[f"{f}-{'frozen' if z else 'trainable'}" for f, z in CASES])
def test_stair_equals_slow_reference(family, frozen, monkeypatch):
    model = _load(family)
    for p in model.parameters():
        p.requires_grad_(not frozen)
    ids, span, clean, o, noise, present = _setup(model)
    tracer = SimpleNamespace(model=model, samples=SAMPLES, reuse_prefix=True)
    run = Runner(tracer, ids, noise, span, clean, o)
    assert run.stair, "the stair must be the default route"
    # the stair alone: the bridge route's row runs may not be used
    monkeypatch.setattr(Runner, "rows", lambda *a, **k: pytest.fail("the bridge route ran"))
    L = int(model.cfg.n_layers)
    for window in WINDOWS:
        with torch.no_grad():
            got = stair_restoration_probs(run, KINDS, window, span[0], L, batch_size=7, present=present)
        for ki, kind in enumerate(KINDS):
            if kind == "resid" and window != WINDOWS[0]:
                continue  # one layer whatever the window
            ref = _reference(model, ids, span, clean, o, noise, kind, window, present)
            effect = (ref - ref.min()).abs().max().item()  # the largest spread of the grid
            assert effect > 0, "the reference grid is flat: the test would not see a wrong row"
            torch.testing.assert_close(got[:, ki], ref, atol=max(1e-5 * effect, 1e-7), rtol=0)


def test_stair_is_what_fit_uses(monkeypatch):
    """CausalTrace.fit takes the stair by default (the bridge route's rows are never run)."""
    from capinterp.core.example import Example
    from capinterp.localizers.causal_trace import CausalTrace

    model = load_model("tiny", threads=1)
    used = []
    real = tracing.stair_restoration_probs
    monkeypatch.setattr(tracing, "stair_restoration_probs", lambda *a, **k: used.append(1) or real(*a, **k))
    monkeypatch.setattr(Runner, "rows", lambda *a, **k: pytest.fail("the bridge route ran"))
    fact = Example(PROMPT, "", {"subject": SUBJECT, "target_from": "greedy"})
    CausalTrace(model, samples=2, window=3, progress=False).fit([fact])
    assert used


def test_keep_last_is_contiguous():
    """A strided last-position slice makes the frozen unembedding a batched matmul over copies of W_U."""
    act = torch.randn(4, 6, 8)
    kept = tracing._keep_last(act, None)
    assert kept.shape == (4, 1, 8) and kept.is_contiguous()
    torch.testing.assert_close(kept, act[:, -1:])
