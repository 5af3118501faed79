"""Closed-form IG on scale-invariant FFN outputs (Gemma 2/3's post-FFN RMSNorm): the node
substitution is exact for quadratics, equals node-by-node integration on a tiny Gemma 3 to float32
noise, and every case it does not cover (other architectures, baselines, nodes at 0, few nodes,
a failed check) integrates node by node."""

from __future__ import annotations

import pytest
import torch

import capinterp as ci
import capinterp.kernels.ig as ig
from capinterp.arch.tiny import tiny_tokenizer
from capinterp.core.tokens import encode
from capinterp.data import Example
from capinterp.kernels.ig_config import IGConfig
from capinterp.kernels.invariant import N_NODES, lagrange_basis, scale_invariant, substitute_nodes
from capinterp.kernels.quadrature import quadrature

EXAMPLES = [Example("3+4=", "7"), Example("12*3=", "36"), Example("8-5=", "3")]


@pytest.fixture(scope="module")
def tiny_gemma(tmp_path_factory):
    """A randomly initialised 2-layer Gemma 3 (post-FFN RMSNorm), loaded like any local folder."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    tok = tiny_tokenizer()
    cfg = Gemma3TextConfig(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=256,
        sliding_window=64,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    cfg.architectures = ["Gemma3ForCausalLM"]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        hf = Gemma3ForCausalLM(cfg).eval()
        for p in hf.parameters():
            if p.dim() == 2:
                torch.nn.init.normal_(p, std=0.15)
    folder = tmp_path_factory.mktemp("tiny-gemma3")
    hf.save_pretrained(folder)
    tok.save_pretrained(folder)
    return ci.load_model(str(folder))


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(((a - b).abs().amax((1, 2)) / b.abs().amax((1, 2))).max())


def test_lagrange_basis_reproduces_quadratics():
    xs = torch.tensor([1.0, 20.0, 400.0], dtype=torch.float64)
    at = torch.tensor([1.0, 7.5, 100.0, 400.0], dtype=torch.float64)
    p = lambda x: 2 - 0.3 * x + 1e-3 * x**2  # noqa: E731
    assert torch.allclose(lagrange_basis(xs, at) @ p(xs), p(at), rtol=1e-12)
    assert torch.allclose(lagrange_basis(xs, xs), torch.eye(3, dtype=torch.float64))


@pytest.mark.parametrize("rule,steps", [("right", 20), ("midpoint", 10), ("gauss", 7)])
def test_node_substitution_is_exact_for_polynomials_in_inverse_alpha_squared(rule, steps):
    """sum_k w_k h(alpha_k) / alpha_k from four nodes, exactly, for h cubic in x = 1/alpha^2;
    the embedded three-node sum is exact for quadratics and misses a cubic term."""
    alphas, weights = quadrature(steps, rule)
    exact = lambda h: float((weights * h(alphas) / alphas).sum())  # noqa: E731
    cubic = lambda a: 1.5 + 0.02 / a**2 - 3e-5 / a**4 + 1e-8 / a**6  # noqa: E731
    quadratic = lambda a: 1.5 + 0.02 / a**2 - 3e-5 / a**4  # noqa: E731
    nodes, high, low = substitute_nodes(alphas, weights)
    assert len(nodes) == 4 and float(nodes[0]) == 1.0 and float(nodes[-1]) == pytest.approx(float(alphas.min()))
    assert float(high @ cubic(nodes)) == pytest.approx(exact(cubic), rel=1e-10)
    assert float(low @ quadratic(nodes)) == pytest.approx(exact(quadratic), rel=1e-10)
    assert abs(float(low @ cubic(nodes)) - exact(cubic)) > 1e-6  # the estimator sees the cubic term
    assert float(high @ torch.ones(4, dtype=torch.float64)) == pytest.approx(float((weights / alphas).sum()))


def test_scale_invariance_is_detected_from_the_architecture(tiny_gemma, tiny):
    assert scale_invariant(tiny_gemma)
    assert not scale_invariant(tiny)  # Llama: the FFN output enters the residual unnormalized


@pytest.mark.parametrize("positions", ["answer", "last_prompt"])
@pytest.mark.parametrize("rule,steps", [("right", 20), ("midpoint", 10), ("gauss", 8)])
def test_closed_form_equals_integration_on_gemma(tiny_gemma, positions, rule, steps):
    enc = encode(tiny_gemma, EXAMPLES)
    stats: dict = {}
    fast = ig.ig_scores(tiny_gemma, enc, IGConfig(steps=steps, rule=rule, positions=positions), stats=stats)
    exact = ig.ig_scores(tiny_gemma, enc, IGConfig(steps=steps, rule=rule, positions=positions, invariance="off"))
    assert (stats["closed_form"], stats["integrated"]) == (len(EXAMPLES), 0)
    n_layers = tiny_gemma.cfg.n_layers
    # alpha = 1: one row for all layers; alpha = 0 (the baseline, for completeness): one per layer
    assert stats["rows"] == len(EXAMPLES) * (n_layers * N_NODES + 1)
    est = stats["error_estimate"]  # the closed form's own check, per example and layer
    assert est.shape == (len(EXAMPLES), n_layers) and bool((est >= 0).all()) and bool((est < 2e-3).all())
    assert bool((stats["nodes"] == N_NODES).all())
    assert bool(torch.isfinite(stats["completeness"]).all())
    assert _rel(fast, exact) < 1e-4
    assert exact.abs().amax() > 0


def test_closed_form_holds_in_bfloat16(tiny_gemma, tmp_path):
    enc = encode(tiny_gemma, EXAMPLES)
    ref = ig.ig_scores(tiny_gemma, enc, IGConfig(steps=20, invariance="off"))
    tiny_gemma.to(torch.bfloat16)
    try:
        stats: dict = {}
        half = ig.ig_scores(tiny_gemma, enc, IGConfig(steps=20), stats=stats)
    finally:
        tiny_gemma.to(torch.float32)
    assert stats["closed_form"] == len(EXAMPLES)
    assert _rel(half, ref) < 0.1  # bfloat16's own error (8 mantissa bits), not the substitution's


def test_uncovered_cases_integrate_node_by_node(tiny_gemma, tiny, monkeypatch):
    enc = encode(tiny_gemma, EXAMPLES[:2])
    cases = [
        (tiny_gemma, IGConfig(steps=20, rule="left"), None),  # a node at alpha = 0
        (tiny_gemma, IGConfig(steps=7, rule="gauss"), None),  # under 8 nodes: the saving would not pay
        (tiny_gemma, IGConfig(steps=20), torch.full((128,), 0.1)),  # non-zero baseline
        (tiny, IGConfig(steps=20), None),  # no post-FFN norm
    ]
    for model, config, base in cases:
        e = enc if model is tiny_gemma else encode(tiny, EXAMPLES[:2])
        stats: dict = {}
        out = ig.ig_scores(model, e, config, baseline=base, stats=stats)
        assert (stats["closed_form"], stats["integrated"]) == (0, 2), config
        assert torch.equal(out, ig.ig_scores(model, e, config.replace(invariance="off"), baseline=base))
    monkeypatch.setattr(ig, "check_tolerance", lambda dtype: 0.0)  # the check fails: integrate
    stats = {}
    out = ig.ig_scores(tiny_gemma, enc, IGConfig(steps=20), stats=stats)
    assert (stats["closed_form"], stats["integrated"]) == (0, 2)
    assert torch.equal(out, ig.ig_scores(tiny_gemma, enc, IGConfig(steps=20, invariance="off")))
    with pytest.raises(ValueError, match="invariance"):
        ig.ig_scores(tiny_gemma, enc, IGConfig(invariance="sometimes"))


def test_localizers_pass_invariance_through(tiny_gemma):
    """CNL and KN sum in closed form by default and integrate with invariance="off"; same sets."""
    cnl = lambda inv: ci.CNL(tiny_gemma, steps=20, invariance=inv, progress=False).fit(EXAMPLES)  # noqa: E731
    auto, off = cnl("auto"), cnl("off")
    assert _rel(auto.scores_.scores[None], off.scores_.scores[None]) < 1e-4
    assert auto.neurons_.keys() == off.neurons_.keys()
    kn = lambda inv: ci.KN(tiny_gemma, steps=20, invariance=inv, progress=False).fit(EXAMPLES[:2])  # noqa: E731
    assert kn("auto").neurons_.keys() == kn("off").neurons_.keys()
    with pytest.raises(ValueError, match="invariance"):
        ci.CNL(tiny_gemma, invariance="never")
    with pytest.raises(ValueError, match="invariance"):
        ci.localizers.get("sig")(tiny_gemma, invariance="auto")
