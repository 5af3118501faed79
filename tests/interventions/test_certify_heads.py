"""ci.certify over attention heads: each sampled head's effect is zeroing that head's ``z_h`` by hand
(TransformerLens's ``hook_z`` input of ``W_O``), the exhaustive certificate is the truth, and a key
that is not a head of the model is refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import capinterp as ci
from capinterp.core.tokens import encode
from capinterp.data import Example
from capinterp.interventions.certify import certify

FACTS = [Example("Rome is the capital of", " Italy"), Example("Berlin is the capital of", " Germany")]


@pytest.fixture(scope="module")
def model():
    return ci.load_model("tiny", threads=1)


@torch.no_grad()
def _mean_p(model, head=None) -> float:
    hooks = []
    if head is not None:
        l, h = head
        d = model.cfg.d_head

        def zero(z, hook):
            z = z.clone()
            if z.ndim == 4:
                z[:, :, h] = 0
            else:
                z[..., h * d : (h + 1) * d] = 0
            return z

        hooks = [(f"blocks.{l}.attn.o.hook_in", zero)]
    ps = []
    for it in encode(model, FACTS):
        logits = model.run_with_hooks(torch.tensor([it.prompt_ids]), fwd_hooks=hooks)
        ps.append(float(logits[0, -1].softmax(-1)[it.target_ids[0]]))
    return float(np.mean(ps))


def test_head_effects_are_zeroing_the_head_by_hand(model):
    n = model.cfg.n_layers * model.cfg.n_heads
    located = ci.KeySet([(0, 0), (1, 1)], kind="head")
    c = certify(model, located, FACTS, budget=n, tau=1e-4)
    assert c.kind == "head" and c.n_located == 2 and c.n_outside == c.sampled == n - 2
    assert not {(0, 0), (1, 1)} & set(c.sampled_units)
    full = _mean_p(model)
    assert c.full_metric == pytest.approx(full, abs=1e-5)
    effects = dict(zip(c.sampled_units, c.sampled_effects))
    for head in list(effects)[:3]:
        assert effects[head] == pytest.approx(full - _mean_p(model, head), abs=1e-7)
    x = np.maximum(np.array(c.sampled_effects), 0.0)  # every outside head patched: the bounds are the truth
    assert c.count_bound == int((x > 1e-4).sum()) and c.total_bound == pytest.approx(x.sum())
    assert max(abs(e) for e in c.sampled_effects) > 1e-6  # the patches do change the output


def test_head_scores_and_bad_heads(model):
    L, H = model.cfg.n_layers, model.cfg.n_heads
    scores = torch.arange(L * H, dtype=torch.float64).view(L, H)
    c = certify(model, ci.KeySet([(L - 1, H - 1)], kind="head"), FACTS, budget=2, scores=scores, top=2, strata=2)
    assert c.sampled_units[:2] == ((L - 1, H - 2), (L - 1, H - 3))  # the best-scored outside heads, whole
    with pytest.raises(ValueError, match="not a \\(layer, head\\)"):
        certify(model, ci.KeySet([(L, 0)], kind="head"), FACTS, budget=2)
    with pytest.raises(ValueError, match="head scores"):
        certify(model, ci.KeySet([(0, 0)], kind="head"), FACTS, budget=2, scores=torch.zeros(L))
