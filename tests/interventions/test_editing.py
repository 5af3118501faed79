"""Knowledge editing through value vectors: erase / update planted facts, restoration, bad input."""

import copy

import pytest
import torch
from fact_planting import FACT_A, FACT_B, NEURONS_A, NEURONS_B, plant_facts

import capinterp as ci
from capinterp.data import Example
from capinterp.interventions.edit_eval import EditBaseline, next_token_probs, perplexity, prompt_ids
from capinterp.interventions.editing import edit_knowledge, edit_table, last_activations, value_weight
from capinterp.localizers.kn import KN
from capinterp.localizers.query_localization import QueryLocalization
from capinterp.units.neurons import NeuronSet

TEXT = ["The Eiffel Tower is in the city of Paris .", "Rome is the capital of Italy ."]


@pytest.fixture(scope="module")
def planted():
    m = ci.load_model("tiny")
    plant_facts(m)
    return m


@pytest.fixture(scope="module")
def ql(planted):
    return QueryLocalization(planted, steps=5, progress=False).fit([FACT_A, FACT_B])


def _top1(model, fact):
    return next_token_probs(model, [prompt_ids(model, q.prompt) for q in fact]).argmax(-1).tolist()


def _params(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("method", ["consistency-aware", "query", "union"])
def test_erase_removes_planted_fact_and_spares_the_other(planted, ql, method):
    paris, tokyo = (planted.tokenizer(t, add_special_tokens=False)["input_ids"][0] for t in (" Paris", " Tokyo"))
    assert _top1(planted, FACT_A) == [paris] * 3 and _top1(planted, FACT_B) == [tokyo] * 3
    edit = edit_knowledge(planted, FACT_A, method, "erase", ql=ql, unrelated=FACT_B, neutral_text=TEXT)
    assert set(NEURONS_A) <= set(edit.neurons) and not set(NEURONS_B) & set(edit.neurons)
    m = edit.metrics
    assert m["reliability"] == 1.0 and m["generalization"] == 1.0 and m["locality"] == 1.0 and m["avg"] == 1.0
    assert m["rel_prob"] > 0.9 and m["ppl_before"] > 1 and m["n_neurons"] == len(edit.neurons)
    with edit.apply(planted):
        assert paris not in _top1(planted, FACT_A)
        assert _top1(planted, FACT_B) == [tokyo] * 3
    assert _top1(planted, FACT_A) == [paris] * 3  # restored


def test_erasing_the_other_facts_neurons_leaves_the_fact(planted, ql):
    e = edit_knowledge(planted, FACT_A, neurons=ql.neurons(1, "union"), unrelated=FACT_B)
    assert e.metrics["reliability"] == 0.0 and e.metrics["locality"] < 1.0


def test_caller_model_untouched_unless_inplace(planted, ql):
    before = _params(planted)
    edit = edit_knowledge(planted, FACT_A, "union", "erase", ql=ql)
    with pytest.raises(RuntimeError), edit.apply(planted):
        raise RuntimeError("boom")
    after = _params(planted)
    assert all(torch.equal(before[k], after[k]) for k in before)
    copy_ = edit.edited_copy(planted)
    assert all(torch.equal(before[k], v) for k, v in _params(planted).items())
    clone = copy.deepcopy(planted)
    e2 = edit_knowledge(clone, FACT_A, "union", "erase", ql=ql, inplace=True)
    assert e2.model is clone
    changed = {k for k, v in _params(clone).items() if not torch.equal(before[k], v)}
    edited_layers = {l for l, _ in edit.neurons}
    assert changed == {f"blocks.{l}.mlp.out.weight" for l in edited_layers}
    for layer in range(clone.cfg.n_layers):
        w_new, _ = value_weight(clone, layer)
        w_old, _ = value_weight(planted, layer)
        idx = edit.neurons.mask[layer]
        assert torch.all(w_new[:, idx] == 0)
        assert torch.equal(w_new[:, ~idx], w_old[:, ~idx])  # frozen value vectors unchanged
    for k, v in _params(copy_).items():
        assert torch.equal(v, _params(clone)[k])


def test_update_moves_the_answer(planted, ql):
    rome = planted.tokenizer(" Rome", add_special_tokens=False)["input_ids"][0]
    tokyo_top = _top1(planted, FACT_B)
    planted_set = NeuronSet.from_indices(NEURONS_A, planted.cfg.n_layers, planted.cfg.d_mlp)
    edit = edit_knowledge(planted, FACT_A, mode="update", new_target="Rome", neurons=planted_set, unrelated=FACT_B)
    assert edit.new_target == " Rome"
    assert edit.metrics["reliability"] == 1.0 and edit.metrics["generalization"] == 1.0
    assert edit.metrics["locality"] == 1.0 and edit.metrics["rel_prob"] > 0.5
    with edit.apply(planted):
        assert _top1(planted, FACT_A) == [rome] * 3 and _top1(planted, FACT_B) == tokyo_top


@pytest.mark.parametrize("signed", [True, False])
def test_update_rule_and_activation_sign(planted, signed):
    paris = planted.tokenizer(" Paris", add_special_tokens=False)["input_ids"][0]
    rome = planted.tokenizer(" Rome", add_special_tokens=False)["input_ids"][0]
    everything = NeuronSet(torch.ones(planted.cfg.n_layers, planted.cfg.d_mlp, dtype=torch.bool))
    acts = last_activations(planted, prompt_ids(planted, FACT_A[0].prompt), everything)
    neg, pos = (0, int(acts[0].argmin())), NEURONS_A[0]
    assert acts[neg] < 0 < acts[pos]
    ns = NeuronSet.from_indices([neg, pos], planted.cfg.n_layers, planted.cfg.d_mlp)
    edit = edit_knowledge(planted, FACT_A, mode="update", new_target=" Rome", neurons=ns, signed=signed, evaluate=False)
    e_old, e_new = planted.W_U[:, paris].detach(), planted.W_U[:, rome].detach()
    for (layer, i), sign in ((neg, -1.0 if signed else 1.0), (pos, 1.0)):
        idx, rows = edit.values[layer]
        v = value_weight(planted, layer)[0][:, i].detach().float()
        want = v + sign * (8 * v.norm() * e_new / e_new.norm() - v.norm() * e_old / e_old.norm())
        torch.testing.assert_close(rows[idx.tolist().index(i)], want)


def test_edit_localizes_by_itself(planted, monkeypatch):
    edit = edit_knowledge(planted, FACT_A, "consistency-aware", "erase", steps=4)
    assert set(NEURONS_A) <= set(edit.neurons) and edit.metrics["reliability"] == 1.0
    q = edit_knowledge(planted, FACT_A[:1], "query", "erase", steps=4)  # one query is enough here
    assert set(NEURONS_A) <= set(q.neurons)


def test_edit_table(planted, ql):
    table, raw = edit_table(planted, [FACT_A, FACT_B], ql=ql, neutral_text=TEXT, per_fact=True)
    assert list(zip(table["mode"], table["selection"])) == [
        (mo, me) for mo in ("erase", "update") for me in ("consistency-aware", "query", "union")
    ]
    assert (table["n_facts"] == 2).all() and len(raw) == 12
    erase = table[table["mode"] == "erase"]
    assert (erase["reliability"] == 1.0).all() and (erase["locality"] == 1.0).all()
    assert table[["reliability", "generalization", "locality"]].stack().between(0, 1).all()
    with pytest.raises(ValueError, match="other facts"):
        edit_table(planted, [FACT_B, FACT_A], ql=ql)
    fixed, raw_fixed = edit_table(
        planted, [FACT_A, FACT_B], ql=ql, modes=("erase",), selections=("union",), unrelated=[FACT_A[0]], per_fact=True
    )
    assert list(raw_fixed["locality"]) == [0.0, 1.0]  # erasing A changes A's own prompt, erasing B does not


def test_perplexity_matches_the_loss(planted):
    ids = prompt_ids(planted, TEXT[0])
    with torch.no_grad():
        loss = planted(torch.tensor([ids]), return_type="loss")
    assert perplexity(planted, TEXT[0]) == pytest.approx(float(torch.exp(loss)), rel=1e-4)


@pytest.mark.parametrize(
    "args, kwargs, match",
    [
        (("consistency-aware", "erase"), {"fact": []}, "at least 2"),
        (("consistency-aware", "erase"), {"fact": FACT_A[:1]}, "at least 2"),
        (("everything", "erase"), {}, "unknown selection"),
        (("union", "forget"), {}, "unknown mode"),
        (("union", "update"), {}, "new_target"),
        (("union", "update", " Paris"), {}, "same token"),
        (("union", "erase", " Rome"), {}, "only used with mode='update'"),
        (("query", "erase"), {"query_index": 7}, "out of range"),
        (("union", "erase"), {"direction": "sideways"}, "direction"),
        (("union", "update", " Rome"), {"lambdas": (1.0, -2.0)}, "lambdas"),
        (("union", "update", "  "), {}, "empty target"),
        (("query", "erase"), {"query_index": 1.0}, "query_index"),
        (("query", "erase"), {"query_index": True}, "query_index"),
        (("union", "erase"), {"batch_size": 0}, "batch_size"),
        (("union", "erase"), {"baseline": EditBaseline(ppl=float("nan"))}, "baseline.ppl"),
        (("union", "erase"), {"fact": [("a b c", ""), ("a b d", "")]}, "empty target"),
    ],
)
def test_bad_input_is_refused_before_work(planted, monkeypatch, args, kwargs, match):
    monkeypatch.setattr(KN, "fit", lambda *a, **k: pytest.fail("attribution ran before validation"))
    fact = kwargs.pop("fact", FACT_A)
    with pytest.raises(ValueError, match=match):
        edit_knowledge(planted, fact, *args, **kwargs)


@pytest.mark.parametrize("flag", ["signed", "inplace", "evaluate"])
def test_flags_must_be_booleans(planted, monkeypatch, flag):
    monkeypatch.setattr(KN, "fit", lambda *a, **k: pytest.fail("attribution ran before validation"))
    with pytest.raises(TypeError, match=flag):
        edit_knowledge(planted, FACT_A, "union", "erase", **{flag: 1})


def test_edit_table_bad_input(planted, monkeypatch):
    monkeypatch.setattr(KN, "fit", lambda *a, **k: pytest.fail("attribution ran before validation"))
    with pytest.raises(ValueError, match="no facts"):
        edit_table(planted, [])
    with pytest.raises(ValueError, match="unknown selection"):
        edit_table(planted, [FACT_A, FACT_B], selections=["random"])
    with pytest.raises(ValueError, match="two different answers"):
        edit_table(planted, [FACT_A, [Example("The Eiffel Tower stands in the city of", " Paris")] * 2])


def test_localization_parameters_need_no_fitted_neurons(planted, ql):
    with pytest.raises(ValueError, match="configure a new localization"):
        edit_knowledge(planted, FACT_A, ql=ql, steps=4)
    with pytest.raises(ValueError, match="already fitted"):
        edit_table(planted, [FACT_A, FACT_B], ql=ql, steps=4)


def test_a_given_baseline_is_used_not_remeasured(planted, ql):
    """``baseline=EditBaseline(ppl, probs)``: the unedited measurements edit_table takes once per fact."""
    ns = ql.neurons(0, "union")
    plain = edit_knowledge(planted, FACT_A, neurons=ns, unrelated=FACT_B, neutral_text=TEXT)
    probs = next_token_probs(planted, [prompt_ids(planted, q.prompt) for q in [*FACT_A, FACT_B[0]]])
    reused = edit_knowledge(
        planted, FACT_A, neurons=ns, unrelated=[FACT_B[0]], neutral_text=TEXT, baseline=EditBaseline(2.5, probs)
    )
    assert reused.metrics["ppl_before"] == 2.5  # taken as given: the measured one is not 2.5
    assert plain.metrics["ppl_before"] != 2.5
    assert reused.metrics["reliability"] == plain.metrics["reliability"]
    with pytest.raises(ValueError, match="baseline.probs must be"):
        edit_knowledge(planted, FACT_A, neurons=ns, unrelated=FACT_B, baseline=EditBaseline(probs=probs[:1]))
    with pytest.raises(ValueError, match="baseline.ppl"):
        edit_knowledge(planted, FACT_A, neurons=ns, baseline=EditBaseline(ppl=0.5))
    with pytest.raises(TypeError, match="EditBaseline"):
        edit_knowledge(planted, FACT_A, neurons=ns, baseline={"ppl": 2.5})  # type: ignore[arg-type]
