"""KN and CNL on planted neurons, resumable/mergeable fits, and bad input."""

import pytest
import torch
from planting import PLANTED, plant

import capinterp as ci
from capinterp.data import Example
from capinterp.kernels.accumulate import ScoreSum

EXAMPLES = [Example(f"{a}+{b}=", "7") for a, b in [(3, 4), (5, 2), (1, 6), (2, 5), (6, 1), (4, 3)]]


@pytest.fixture(scope="module")
def planted():
    m = ci.load_model("tiny")
    plant(m, EXAMPLES)
    return m


@pytest.mark.parametrize("cls", [ci.CNL, ci.KN, ci.DCSN])
def test_localizers_rank_planted_neurons_on_top(planted, cls):
    loc = cls(planted, progress=False).fit(EXAMPLES)
    assert set(loc.scores_.top_k(3)) == set(PLANTED)
    assert set(PLANTED) <= set(loc.neurons_)


@pytest.mark.parametrize("cls", [ci.CNL, ci.KN])
def test_random_model_does_not_single_out_planted_neurons(cls):
    m = ci.load_model("tiny")
    loc = cls(m, steps=5, progress=False).fit(EXAMPLES[:3])
    assert not set(PLANTED) <= set(loc.scores_.top_k(20))


def test_kn_coarse_and_refined_sets(planted):
    kn = ci.KN(planted, threshold=0.2, share=0.5, progress=False).fit(EXAMPLES)
    assert len(kn.coarse_) == len(EXAMPLES)
    assert kn.counts_.max() <= len(EXAMPLES)
    union = ci.KN(planted, refine=False, progress=False).fit(EXAMPLES).neurons_
    assert set(kn.neurons_) <= set(union)
    for c in kn.coarse_:  # every coarse neuron is positive and above 0.2 * max of its prompt
        assert all(kn.prompt_scores_[kn.coarse_.index(c)][l, i] > 0 for l, i in c)


def test_kn_plain_prompts_use_greedy_target(planted):
    kn = ci.KN(planted, steps=4, progress=False).fit(["3+4=", "5+2="])
    assert kn.scores_.meta["n_samples"] == 2
    assert set(kn.scores_.top_k(3)) == set(PLANTED)  # the planted model's greedy answer is "7"


def test_cnl_multi_token_answers_use_all_answer_positions(tiny):
    ex = [Example("12*3=", "36"), Example("4*9=", "36")]
    a = ci.CNL(tiny, steps=4, progress=False).fit(ex).scores_.scores
    b = ci.CNL(tiny, steps=4, positions="last_prompt", progress=False).fit(ex).scores_.scores
    assert not torch.allclose(a, b)


def test_interrupted_fit_resumes_to_the_same_scores(planted, tmp_path, monkeypatch):
    ck = tmp_path / "cnl.ckpt"
    full = ci.CNL(planted, steps=4, progress=False).fit(EXAMPLES).scores_.scores
    loc = ci.CNL(planted, steps=4, progress=False, checkpoint=ck)
    real, calls = loc._score_chunk, []

    def dying(items):
        if len(calls) == 3:
            raise KeyboardInterrupt
        calls.append(1)
        return real(items)

    monkeypatch.setattr(loc, "_score_chunk", dying)
    with pytest.raises(KeyboardInterrupt):
        loc.fit(EXAMPLES)
    monkeypatch.undo()
    resumed = ci.CNL(planted, steps=4, progress=False, checkpoint=ck)
    done_before = ScoreSum.load(ck).count
    assert done_before == 3
    torch.testing.assert_close(resumed.fit(EXAMPLES).scores_.scores, full, rtol=1e-6, atol=1e-9)
    with pytest.raises(ValueError, match="different computation"):
        ci.CNL(planted, steps=5, progress=False, checkpoint=ck).fit(EXAMPLES)


def test_shards_scored_separately_merge_exactly(planted):
    whole = ci.CNL(planted, steps=4, progress=False).fit(EXAMPLES)
    a = ci.CNL(planted, steps=4, progress=False).fit(EXAMPLES[:2]).sums_
    b = ci.CNL(planted, steps=4, progress=False).fit(EXAMPLES[2:]).sums_
    merged_sum = a.sum + b.sum
    torch.testing.assert_close((merged_sum / 6).float(), whole.scores_.scores, rtol=1e-6, atol=1e-10)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"steps": 0}, "steps must be"),
        ({"sigma": -1}, "sigma must be > 0"),
        ({"rule": "mid"}, "unknown rule"),
        ({"positions": "all"}, "unknown positions"),
        ({"route": "magic"}, "unknown route"),
        ({"tol": -1.0}, "tol must be"),
    ],
)
def test_cnl_bad_hyper_parameters(tiny, kwargs, match):
    with pytest.raises(ValueError, match=match):
        ci.CNL(tiny, **kwargs)


def test_bad_data_is_refused_before_work(tiny):
    with pytest.raises(ValueError, match="empty dataset"):
        ci.CNL(tiny).fit([])
    with pytest.raises(ValueError, match="ends in whitespace"):
        ci.CNL(tiny).fit([Example("The capital is ", "Paris")])
    with pytest.raises(ValueError, match="threshold"):
        ci.KN(tiny, threshold=1.5)
    with pytest.raises(ValueError, match="no prompts"):
        ci.KN(tiny).fit([])


def test_registry_names():
    assert {"cnl", "kn", "dcsn"} <= set(ci.localizers.available())
    assert ci.localizers.get("cnl") is ci.CNL and ci.localizers.get("KN") is ci.KN


def test_gauss_rule_recovers_planted_neurons(planted):
    """Gauss-Legendre with 5 points finds the planted neurons and is recorded in the metadata.

    KN (last prompt token) ranks all three planted neurons on top. CNL's accurate integral gives
    the layer-2/3 planted neurons almost nothing (z-scores of (1,5), (2,17), (3,40): right m=20
    18.8, 8.3, 8.7; gauss m=5 21.1, 5.3, 5.5; gauss m=10 22.6, 0.04, 0.05; gauss m=40 22.6, 0.0,
    0.0), so the first planted neuron is the one it must find: the 20-point right sum's weight on
    the later two is quadrature error.
    """
    kn = ci.KN(planted, rule="gauss", steps=5, progress=False).fit(EXAMPLES)
    assert set(kn.scores_.top_k(3)) == set(PLANTED) and set(PLANTED) <= set(kn.neurons_)
    cnl = ci.CNL(planted, rule="gauss", steps=5, progress=False).fit(EXAMPLES)
    assert list(cnl.scores_.top_k(1)) == [PLANTED[0]] and PLANTED[0] in set(cnl.neurons_)
    for loc in (kn, cnl):
        assert loc.scores_.meta["params"]["rule"] == "gauss" and loc.scores_.meta["params"]["steps"] == 5
