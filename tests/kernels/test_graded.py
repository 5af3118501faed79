"""The graded rule (composite Gauss-Legendre towards alpha = 0) and the adaptive rule built on it (issue 30).

Integrals are checked against closed forms; IG on the tiny Gemma-3-shaped model (post-FFN RMSNorm:
the zero-baseline integrand is a sharp feature at alpha = 0) against IG written here on the plain
transformers model (a pre-hook on ``down_proj``, autograd, a fine graded rule built from its definition).
"""

from __future__ import annotations

import itertools
import math
import warnings

import pytest
import torch
from ig_reference import ref_gauss

from capinterp.kernels.adaptive import adaptive_ig
from capinterp.kernels.completeness import CompletenessWarning
from capinterp.kernels.ig_config import IGConfig
from capinterp.kernels.quadrature import graded, quadrature

SHARP = [1e-2, 1e-3, 1e-4]
#: nodes of the graded schedule's rounds: GL-4, then graded rules (2r - 1 levels below 1, 3 + r nodes per panel)
SCHEDULE = [4, 8, 20, 36, 56, 80, 108]


def sharp(alpha: torch.Tensor, c: float) -> torch.Tensor:
    """h(alpha) / alpha with h = alpha^2 / (alpha^2 + c^2): ~1/alpha above c, -> 0 below."""
    return alpha / (alpha**2 + c**2)


def sharp_integral(c: float) -> float:
    return 0.5 * math.log((1 + c**2) / c**2)


@pytest.mark.parametrize(("levels", "per_level", "growth"), [(0, 3, 0), (1, 4, 0), (5, 2, 0), (8, 6, 0), (5, 3, 2)])
def test_graded_is_exact_on_polynomials(levels, per_level, growth):
    a, w = graded(levels, per_level, growth=growth)
    assert len(a) == (levels + 1) * per_level + growth * levels * (levels + 1) // 2
    assert bool((a[1:] > a[:-1]).all()) and float(a[0]) > 0 and float(a[-1]) < 1
    for k in range(2 * per_level):
        assert float(w @ a**k) == pytest.approx(1 / (k + 1), rel=1e-12, abs=1e-14), k
    if growth == 0:  # one degree more is not integrated exactly (the rule has exactly that degree)
        k = 2 * per_level
        assert abs(float(w @ a**k) - 1 / (k + 1)) > 1e-14


def test_graded_panels_are_where_they_should_be():
    a, w = graded(2, 3, ratio=0.5)
    # panels [0, 1/4], [1/4, 1/2], [1/2, 1], each carrying its width in weight
    for lo, hi in [(0, 0.25), (0.25, 0.5), (0.5, 1.0)]:
        inside = (a > lo) & (a < hi)
        assert int(inside.sum()) == 3
        assert float(w[inside].sum()) == pytest.approx(hi - lo, rel=1e-14)
    g, gw = ref_gauss(5)
    a0, w0 = graded(0, 5)
    assert torch.allclose(a0, torch.tensor(g, dtype=torch.float64), atol=1e-14)
    assert torch.allclose(w0, torch.tensor(gw, dtype=torch.float64), atol=1e-14)


@pytest.mark.parametrize("c", SHARP)
def test_graded_resolves_a_sharp_feature_at_zero(c):
    exact = sharp_integral(c)
    a, w = graded(14, 12)
    assert float(w @ sharp(a, c)) == pytest.approx(exact, rel=1e-10)
    # uniform Gauss-Legendre with as many nodes converges only as exp(-4 m sqrt(c)): far off at c = 1e-4
    g, gw = quadrature(len(a), "gauss")
    uniform = abs(float(gw @ sharp(g, c)) / exact - 1)
    assert uniform > (1e-6 if c <= 1e-4 else 0.0)


def test_graded_rejects_bad_arguments():
    with pytest.raises(ValueError, match="levels"):
        graded(-1, 4)
    with pytest.raises(ValueError, match="per_level"):
        graded(2, 0)
    with pytest.raises(ValueError, match="ratio"):
        graded(2, 4, ratio=1.0)
    with pytest.raises(ValueError, match="growth"):
        graded(2, 4, growth=-1)


def test_graded_growth_gives_upper_panels_more_nodes():
    a, _ = graded(2, 3, ratio=0.5, growth=2)
    counts = [int(((a > lo) & (a < hi)).sum()) for lo, hi in [(0, 0.25), (0.25, 0.5), (0.5, 1.0)]]
    assert counts == [3, 5, 7]


def _analytic_run(cs: dict[int, float]):
    """A ``run`` for :func:`adaptive_ig` whose "layers" integrate known functions: per layer, scores
    (sharp(c), cos(3 alpha), 1) with F(x) - F(b) their exact total, so completeness is exact too."""
    calls = []

    def exact(l):
        c = cs[l]
        return torch.tensor([sharp_integral(c), math.sin(3) / 3, 1.0], dtype=torch.float64)

    def run(layers, alphas, weights):
        calls.append((list(layers), len(alphas)))
        rows = []
        for l in layers:
            c = cs[l]
            f = torch.stack([sharp(alphas, c), torch.cos(3 * alphas), torch.ones_like(alphas)])
            rows.append(f @ weights)
        f_base = torch.tensor([1.0 - float(exact(l).sum()) for l in layers], dtype=torch.float64)
        return torch.stack(rows), 1.0, f_base

    return run, exact, calls


@pytest.mark.parametrize("tol", [1e-3, 1e-6])
def test_adaptive_meets_tol_on_sharp_layers_and_says_so_honestly(tol):
    cs = {0: 0.3, 1: 1e-2, 2: 1e-3, 3: 1e-4}
    run, exact, calls = _analytic_run(cs)
    res = adaptive_ig(run, list(cs), IGConfig(rule="adaptive", tol=tol, max_steps=128), schedule="graded")
    assert not res.capped
    for l in cs:
        err = float((res.scores[l] - exact(l)).norm() / exact(l).norm())
        assert res.error[l] <= tol
        assert err <= res.error[l] * 1.01 + 1e-15, (l, err, res.error[l])  # the estimate bounds the error
    # a sharper feature needs more nodes; nodes follow the schedule
    assert res.nodes[0] <= res.nodes[1] <= res.nodes[2] <= res.nodes[3]
    assert res.nodes[3] > res.nodes[0]
    assert set(res.nodes.values()) <= set(SCHEDULE[1:])
    assert [n for _, n in calls] == SCHEDULE[: len(calls)]
    # converged layers drop out: each call's layers are a subset of the previous call's
    assert all(set(b) <= set(a) for (a, _), (b, _) in itertools.pairwise(calls))


def test_doubling_cannot_resolve_what_graded_does():
    cs = {0: 1e-4}
    run, exact, _ = _analytic_run(cs)
    old = adaptive_ig(run, [0], IGConfig(rule="adaptive", tol=1e-3, max_steps=128), schedule="doubling")
    assert old.capped == [0] and old.nodes[0] == 128 and old.error[0] > 1e-3
    new = adaptive_ig(run, [0], IGConfig(rule="adaptive", tol=1e-3, max_steps=128), schedule="graded")
    assert not new.capped and new.error[0] <= 1e-3
    with pytest.raises(ValueError, match="schedule"):
        adaptive_ig(run, [0], IGConfig(rule="adaptive", tol=1e-3, max_steps=128), schedule="halving")


def test_adaptive_caps_with_the_estimate_above_tol():
    run, _, _ = _analytic_run({0: 1e-4})
    res = adaptive_ig(run, [0], IGConfig(rule="adaptive", tol=1e-3, max_steps=50), schedule="graded")
    assert res.capped == [0] and res.nodes[0] == 36 and res.error[0] > 1e-3


def test_auto_schedule_grades_only_where_the_integrand_is_singular_at_zero():
    run, _, calls = _analytic_run({0: 1e-4})
    adaptive_ig(run, [0], IGConfig(rule="adaptive", tol=1e-3, max_steps=128), schedule="auto", singular_at_zero=True)
    assert [n for _, n in calls] == SCHEDULE[: len(calls)]
    calls.clear()
    adaptive_ig(run, [0], IGConfig(rule="adaptive", tol=1e-3, max_steps=128), schedule="auto", singular_at_zero=False)
    assert [n for _, n in calls] == [4, 8, 16, 32, 64, 128]


# --- the tiny Gemma-3-shaped model against plain transformers ---------------------------------


def _ref_graded(levels: int, per_level: int, ratio: float = 0.25) -> list[tuple[float, float]]:
    g, gw = ref_gauss(per_level)
    edges = [0.0] + [ratio**j for j in range(levels, -1, -1)]
    return [(lo + (hi - lo) * x, (hi - lo) * wx) for lo, hi in itertools.pairwise(edges) for x, wx in zip(g, gw)]


def _hf_ig(hf, ids: list[int], pos: int, target: int, layer: int, rule) -> tuple[torch.Tensor, float, float]:
    """IG of p(target at pos) w.r.t. the input of ``down_proj`` of ``layer`` at ``pos`` (zero
    baseline), on plain transformers; also F(x) and F(0)."""
    mlp = hf.model.layers[layer].mlp
    tokens = torch.tensor([ids])
    state: dict = {}

    def pre(module, args):
        x = args[0]
        if "value" not in state:
            state["act"] = x[0, pos].detach().clone()
            return None
        x = x.clone()
        x[0, pos] = state["value"]
        return (x,)

    handle = mlp.down_proj.register_forward_pre_hook(pre)
    try:

        def F(value=None):
            if value is not None:
                state["value"] = value
            logits = hf(tokens).logits[0, pos].float()
            state.pop("value", None)
            return torch.softmax(logits, -1)[target]

        f_clean = float(F().detach())
        a = state["act"]
        total = torch.zeros_like(a, dtype=torch.float64)
        for alpha, w in rule:
            z = (alpha * a).requires_grad_(True)
            (g,) = torch.autograd.grad(F(z), z)
            total += w * g.double()
        f_zero = float(F(torch.zeros_like(a)).detach())
    finally:
        handle.remove()
    return a.double() * total, f_clean, f_zero


@pytest.fixture(scope="module")
def gemma3_tiny():
    import capinterp as ci
    from capinterp.arch.tiny import tiny_hf
    from capinterp.core.example import Example
    from capinterp.core.tokens import encode

    hf, tok = tiny_hf("gemma3_text")
    bridge = ci.load_model(hf, tokenizer=tok)
    enc = encode(bridge, [Example("1 + 2 =", " 3")])[0]
    ref_hf, _ = tiny_hf("gemma3_text")  # a separate copy for the hand-written reference
    return bridge, enc, ref_hf


def test_adaptive_meets_tol_on_every_layer_of_tiny_gemma3(gemma3_tiny, monkeypatch):
    from capinterp.kernels.ig import ig_scores

    bridge, enc, ref_hf = gemma3_tiny
    pos, target = len(enc.prompt_ids) - 1, enc.target_ids[0]
    tol = 1e-4
    stats: dict = {}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no CompletenessWarning: no layer stops at the cap
        ada = ig_scores(bridge, enc, IGConfig(rule="adaptive", tol=tol, positions="last_prompt"), stats=stats)[0]
    fine = _ref_graded(14, 12)
    for l in range(bridge.cfg.n_layers):
        ref, f_clean, f_zero = _hf_ig(ref_hf, list(enc.ids), pos, target, l, fine)
        # the reference itself is complete to float32 noise: the fine graded rule resolves alpha -> 0
        assert float(ref.sum()) == pytest.approx(
            f_clean - f_zero, rel=5e-5
        )  # F changes by ~3e-5 here: float32 noise is ~1e-5 of it
        err = float((ada[l].double() - ref).norm() / ref.norm())
        assert err < 3 * tol, (l, err)
        assert float(stats["error_estimate"][0, l]) <= tol
        assert float(stats["completeness"][0, l]) < tol
        assert int(stats["nodes"][0, l]) in SCHEDULE[1:]
    # the previous rule (Gauss-Legendre doubled up to 128 nodes) cannot certify tol on this model
    import capinterp.kernels.adaptive as adaptive

    monkeypatch.setattr(adaptive, "SCHEDULE", "doubling")
    with pytest.warns(CompletenessWarning, match="max_steps=128"):
        ig_scores(bridge, enc, IGConfig(rule="adaptive", tol=tol, max_steps=128, positions="last_prompt"))
