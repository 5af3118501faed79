"""SIG and AMIG knowledge-neuron localizers: kernels against references, planted-neuron recovery, QL use."""

import pytest
import torch
from fact_planting import FACT_A, FACT_B, NEURONS_A, NEURONS_B, plant_facts

import capinterp as ci
from capinterp.arch.model import neuron_hook
from capinterp.core.tokens import encode
from capinterp.kernels.ig import ig_scores
from capinterp.kernels.ig_config import IGConfig
from capinterp.kernels.quadrature import quadrature
from capinterp.kernels.sequential import DEFAULT, sig_scores
from capinterp.localizers.amig import mean_activations

NEUTRAL = [
    "The weather was mild and the market opened late on that quiet morning.",
    "She wrote three letters before lunch and then walked to the station.",
]


@pytest.fixture(scope="module")
def planted():
    m = ci.load_model("tiny")
    plant_facts(m)
    return m


def _sig_reference(model, enc, layer, steps, positions, rule="right"):
    """SIG the obvious way: one forward per (position, node), one position scaled, baseline 0."""
    nodes, weights = quadrature(steps, rule)
    last = enc.last_prompt_pos
    tokens = torch.tensor([enc.ids[: last + 1]])
    acts = {}
    model.run_with_hooks(tokens, fwd_hooks=[(neuron_hook(layer), lambda a, hook: acts.setdefault(0, a[0].detach()))])
    a = acts[0]
    out = torch.zeros(a.shape[-1])
    for t in positions:
        g_sum = torch.zeros(a.shape[-1])
        for alpha, w in zip(nodes.tolist(), weights.tolist()):
            z = (alpha * a[t]).clone().requires_grad_(True)

            def put(act, hook, z=z, t=t):
                act = act.clone()
                act[0, t] = z
                return act

            logits = model.run_with_hooks(tokens, fwd_hooks=[(neuron_hook(layer), put)])
            p = logits[0, last].float().softmax(-1)[enc.target_ids[0]]
            (g,) = torch.autograd.grad(p, z)
            g_sum += w * g
        out += a[t] * g_sum
    return out


def test_sig_on_the_last_token_only_equals_kn_ig(planted):
    enc = encode(planted, FACT_A[:1], max_target_tokens=1)[0]
    sig = sig_scores(planted, enc, DEFAULT.replace(steps=6, batch_size=5), at=[enc.last_prompt_pos])
    ig = ig_scores(planted, enc, IGConfig(steps=6, positions="last_prompt", route="loop"))[0]
    # float32 routes agree to ~1e-4 of the largest score (kernels/ig.py): the thread count changes the
    # summation order (at 2 threads the worst entry differed by 7e-5 of the max, at 1 thread by less)
    assert torch.allclose(sig, ig, rtol=1e-4, atol=1e-4 * float(ig.abs().max()))


def test_sig_matches_one_position_at_a_time_reference(planted):
    enc = encode(planted, FACT_A[:1], max_target_tokens=1)[0]
    pos = list(range(enc.last_prompt_pos + 1))  # tiny prepends no BOS: every prompt token
    sig = sig_scores(planted, enc, DEFAULT.replace(steps=4, batch_size=7), layers=[1])  # chunks cut across positions
    ref = _sig_reference(planted, enc, 1, 4, pos)
    assert torch.allclose(sig[1], ref, rtol=1e-3, atol=1e-5 * float(ref.abs().max()))
    assert sig[0].abs().sum() == 0  # layers not asked for stay 0
    # it differs from KN's last-token IG: earlier tokens are credited too
    assert not torch.allclose(
        sig[1], sig_scores(planted, enc, DEFAULT.replace(steps=4), layers=[1], at=[enc.last_prompt_pos])[1]
    )


@pytest.mark.parametrize("rule", ["gauss", "trapezoid"])
def test_sig_weighted_rules_match_the_reference(planted, rule):
    enc = encode(planted, FACT_A[:1], max_target_tokens=1)[0]
    pos = list(range(enc.last_prompt_pos + 1))
    ref = _sig_reference(planted, enc, 1, 3, pos, rule=rule)
    for method in ("fast", "loop"):
        sig = sig_scores(planted, enc, DEFAULT.replace(steps=3, rule=rule, batch_size=5, route=method), layers=[1])
        assert torch.allclose(sig[1], ref, rtol=1e-3, atol=1e-5 * float(ref.abs().max()))


def test_sig_gauss_converges_with_few_points(tiny):
    """On a smooth path (the unplanted tiny model) Gauss-Legendre's error against a 24-point Gauss
    integral falls fast with points (2.3e-5, 1.9e-6, 1.4e-9 at 2, 4, 8 of a 1.1e-3 maximum), and 8
    points beat the papers' 20-point right sum (2.4e-5) by four orders of magnitude."""
    enc = encode(tiny, FACT_A[:1], max_target_tokens=1)[0]
    ref = sig_scores(tiny, enc, DEFAULT.replace(steps=24, rule="gauss"), layers=[1])[1]
    err = {
        (rule, m): float((sig_scores(tiny, enc, DEFAULT.replace(steps=m, rule=rule), layers=[1])[1] - ref).abs().max())
        for rule, m in [("gauss", 2), ("gauss", 4), ("gauss", 8), ("right", 20)]
    }
    assert err[("gauss", 8)] < err[("gauss", 4)] / 100 < err[("gauss", 2)] / 100
    assert err[("gauss", 8)] < err[("right", 20)] / 1000


def test_sig_finds_the_planted_neurons(planted):
    loc = ci.SIG(planted, steps=5, progress=False).fit(FACT_A)
    found = set(loc.neurons_)
    assert set(NEURONS_A) <= found and not set(NEURONS_B) & found
    assert loc.scores_.meta["method"] == "sig"


def test_amig_ranks_planted_neurons_of_both_facts_on_top(planted):
    """From a neutral-text baseline, A's neurons fire above it and push Paris; B's neurons fire on
    neutral text but are shut on A's prompts, so moving them from baseline to their value removes
    a push towards Tokyo: both get positive attribution, and nothing else comes close."""
    amig = ci.AMIG(planted, steps=5, baseline_texts=NEUTRAL, progress=False).fit(FACT_A)
    top = set(amig.scores_.top_k(5))
    assert set(NEURONS_A) <= top <= set(NEURONS_A) | set(NEURONS_B)
    zero = ci.KN(planted, steps=5, progress=False).fit(FACT_A).scores_.top_k(3)
    assert set(zero) == set(NEURONS_A)  # from a zero baseline only A's neurons count
    assert amig.scores_.meta["method"] == "amig"


def test_amig_with_zero_baseline_is_kn(planted):
    kn = ci.KN(planted, steps=5, progress=False).fit(FACT_A)
    amig = ci.AMIG(planted, steps=5, baseline=torch.zeros(128), progress=False).fit(FACT_A)
    assert torch.allclose(amig.prompt_scores_, kn.prompt_scores_)


def test_amig_completeness_from_the_mean_baseline(planted):
    """IG from b sums to F(a) - F(b) (the completeness axiom), with enough steps."""
    enc = encode(planted, FACT_A[:1], max_target_tokens=1)[0]
    base = mean_activations(planted, NEUTRAL)
    layer = 2
    ig = ig_scores(
        planted, enc, IGConfig(steps=400, positions="last_prompt", route="loop"), baseline=base, layers=[layer]
    )[0]
    tokens = torch.tensor([enc.prompt_ids])

    def p(hooks):
        with torch.no_grad():
            return float(planted.run_with_hooks(tokens, fwd_hooks=hooks)[0, -1].softmax(-1)[enc.target_ids[0]])

    def to_base(act, hook):
        act = act.clone()
        act[0, -1] = base[layer]
        return act

    assert ig[layer].sum() == pytest.approx(p([]) - p([(neuron_hook(layer), to_base)]), rel=2e-2)


def test_mean_activations_is_the_token_mean(planted):
    base = mean_activations(planted, NEUTRAL[:1])
    from capinterp.interventions.edit_eval import prompt_ids

    ids = prompt_ids(planted, NEUTRAL[0])
    got = {}
    planted.run_with_hooks(torch.tensor([ids]), fwd_hooks=[(neuron_hook(3), lambda a, hook: got.setdefault(3, a[0]))])
    skip = 1 if ids[0] == planted.tokenizer.bos_token_id and len(ci.core.tokens.model_bos(planted)) else 0
    assert torch.allclose(base[3], got[3][skip:].mean(0), atol=1e-5)


def test_amig_adaptive_threshold_bounds_the_coarse_sets(planted):
    amig = ci.AMIG(planted, steps=5, baseline_texts=NEUTRAL, min_neurons=2, max_neurons=6, progress=False).fit(FACT_A)
    for c in amig.coarse_:
        assert 2 <= len(c) <= 6 or len(c) < 2  # fewer only when no ratio >= 0 finds 2 positive scores


@pytest.mark.parametrize("name", ["sig", "amig"])
def test_query_localization_accepts_sig_and_amig(planted, name):
    kw = {"baseline_texts": NEUTRAL} if name == "amig" else {}
    ql = ci.QueryLocalization(planted, localizer=name, steps=4, progress=False, **kw).fit([FACT_A, FACT_B])
    assert type(ql.localizer_).name == name
    cas = set(ql.neurons(0, "consistency-aware"))
    assert (set(NEURONS_A) <= cas and not set(NEURONS_B) & cas) if name == "sig" else set(NEURONS_A) & cas
    assert len(ql.consistency_) == 2


def test_bad_parameters(planted):
    with pytest.raises(ValueError, match="positions"):
        ci.SIG(planted, positions="all")
    with pytest.raises(ValueError, match="rule"):
        ci.SIG(planted, rule="gauss-x")
    with pytest.raises(ValueError, match="baseline"):  # its width is checked against the model in fit
        ci.AMIG(planted, baseline=torch.zeros(7), progress=False).fit(FACT_A)
    with pytest.raises(ValueError, match="min_neurons"):
        ci.AMIG(planted, baseline=torch.zeros(128), min_neurons=5, max_neurons=2)
    assert ci.localizers.get("sig") is ci.SIG and ci.localizers.get("amig") is ci.AMIG


@pytest.mark.parametrize("objective", ["prob", "logprob"])
def test_sig_fast_route_equals_loop(objective):
    """The staircase route (prefix once, rows enter at their own block, several layers per batch)
    gives the loop route's scores. On the float64 model (whose attention softmax runs in float32)
    the routes differ by ~2e-7 of the largest score."""
    import warnings

    model = ci.load_model("tiny", dtype=torch.float64)
    enc = encode(model, FACT_A[:1], max_target_tokens=1)[0]
    base = 0.1 * torch.randn(model.cfg.n_layers, model.cfg.d_mlp, generator=torch.Generator().manual_seed(0))
    config = DEFAULT.replace(steps=3, objective=objective, batch_size=5)
    kw = dict(at=[1, 2, enc.last_prompt_pos], baseline=base)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the fast route must run, not fall back
        fast = sig_scores(model, enc, config.replace(route="fast"), **kw)
    loop = sig_scores(model, enc, config.replace(route="loop"), **kw)
    assert fast.abs().max() > 0
    assert ((fast - loop).abs().max() / loop.abs().max()).item() <= 2e-6
    with pytest.raises(ValueError, match="route 'prefix'"):
        sig_scores(model, enc, DEFAULT.replace(route="prefix"))
