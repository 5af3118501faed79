"""Per-expert ROME on an MoE layer (tiny DeepSeek-V2, layer 1: 4 experts of 48 neurons and a shared
expert of 48, W = 240), against plain transformers: one expert's key, covariance and down projection;
the other experts, the shared expert and the dense layer untouched; the default expert is the one
that writes most at the subject. The family matrix checks the whole edit against a hand-written
reference on every MoE family."""

from __future__ import annotations

import functools

import pytest
import torch
from moe_tiny import load_tiny_mixed

import capinterp as ci
from capinterp.arch.weights import down_projection
from capinterp.interventions.second_moment import second_moment

E, DE, D = 4, 48, 32
W = E * DE + DE
# the subject ends the prompt: layer 1 is the last layer, so the edited value must be at the answer's position
FACT = ci.Example("The city that holds the Eiffel Tower", " Paris")
TEXTS = ["The river runs past the old mill.", "Berlin is the capital of Germany.", "1+2=3 and 4+5=9"]
KW = dict(subject="Eiffel Tower", texts=TEXTS, prefixes=["A day. "], steps=8, clamp=100.0, ridge=0.1)


@functools.cache
def _edit(expert: int | None = None):
    model, plain, tok = load_tiny_mixed()
    return model, plain, tok, ci.rome_edit(model, FACT, " Rome", layer=1, expert=expert, **KW)


def _experts_down(hf) -> torch.Tensor:
    """Layer 1's stacked expert down projections as transformers stores them ([E, d_model, d_expert])."""
    return hf.model.layers[1].mlp.experts.down_proj


def test_default_expert_writes_most_at_the_subject():
    """The default expert maximises ||W_e^T k*_e||: k* is read back from the edits of each expert
    (each keeps its own expert's part of the same averaged key)."""
    model, _, _, edit = _edit()
    key = sum(_edit(e)[3].key for e in range(E))
    assert torch.equal(
        key[edit.expert * DE : (edit.expert + 1) * DE], edit.key[edit.expert * DE : (edit.expert + 1) * DE]
    )
    values = down_projection(model, 1).values().float()
    writes = [float((key[e * DE : (e + 1) * DE, None] * values[e * DE : (e + 1) * DE]).sum(0).norm()) for e in range(E)]
    assert sum(w > 0 for w in writes) >= 2  # the subject's token is routed to top-2 experts: a real choice
    assert edit.expert == max(range(E), key=writes.__getitem__)


@pytest.mark.parametrize("expert", [None, 1])
def test_one_experts_rank_one_update(expert):
    """k* and the left vector live on the expert's neurons only; W_e' k*_e = v*; every other weight of the
    model keeps its exact value; leaving the block restores W_e exactly."""
    model, plain, _, edit = _edit(expert)
    e = edit.expert
    assert e is not None and (expert is None or e == expert)
    cols = slice(e * DE, (e + 1) * DE)
    outside = torch.ones(W, dtype=torch.bool)
    outside[cols] = False
    assert not bool(edit.key[outside].any()) and not bool(edit.left[outside].any())
    C, _ = second_moment(model, 1, texts=TEXTS, neurons=cols)
    full, _ = second_moment(model, 1, texts=TEXTS)
    assert torch.allclose(C, full[cols, cols], rtol=1e-5, atol=1e-7)  # the expert's block of the full C
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    proj = down_projection(model, 1)
    with edit:
        torch.testing.assert_close(proj.apply(edit.key[None])[0], edit.value, atol=1e-4, rtol=1e-4)
        changed = {n for n, p in model.named_parameters() if not torch.equal(p, params[n])}
        assert [n.replace("._original_component", "") for n in changed] == ["model.layers.1.mlp.experts.down_proj"]
        stacked = next(p for n, p in model.named_parameters() if n in changed)
        moved = (stacked - params[next(iter(changed))]).abs().sum(dim=(1, 2))
        assert moved.nonzero().flatten().tolist() == [e]  # only expert e's slice of the stacked weight
    assert all(torch.equal(p, params[n]) for n, p in model.named_parameters())


def test_edit_equals_the_hand_written_update_on_plain_transformers():
    """Writing W_e + delta left_e^T into expert e of the plain transformers copy by hand gives the
    edited model's logits."""
    model, plain, tok, edit = _edit()
    e, cols = edit.expert, slice(edit.expert * DE, (edit.expert + 1) * DE)
    ids = tok(FACT.prompt, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        down = _experts_down(plain)  # [E, d_model, d_expert]: keys to values
        old = down[e].clone()
        down[e] += torch.outer(edit.delta, edit.left[cols])
        try:
            with edit:
                torch.testing.assert_close(model(ids), plain(ids).logits, atol=1e-5, rtol=1e-4)
        finally:
            down[e] = old


def test_bad_second_moment_matrix_or_texts_refused_before_any_work(monkeypatch):
    """On an MoE layer a given C is the named expert's ``[d_expert, d_expert]``; the corpus is checked
    before the value optimisation even where C waits for the default expert."""
    from capinterp.interventions import rome

    model = _edit()[0]
    monkeypatch.setattr(rome, "_optimise", lambda *a, **k: pytest.fail("work started"))
    with pytest.raises(ValueError, match=rf"second_moment_matrix must be \[{DE}, {DE}\]"):
        ci.rome_edit(model, FACT, " Rome", layer=1, expert=0, second_moment_matrix=torch.eye(W), **KW)
    with pytest.raises(ValueError, match="one expert's keys.*pass expert= too"):
        ci.rome_edit(model, FACT, " Rome", layer=1, second_moment_matrix=torch.eye(DE), **KW)
    with pytest.raises(ValueError, match="at least one non-empty text"):
        ci.rome_edit(model, FACT, " Rome", layer=1, **{**KW, "texts": [""]})


@pytest.mark.parametrize("expert", [None, "shared"])
def test_the_edit_raises_the_new_target(expert):
    """Editing one expert (the default routed one, or the shared one) moves the answer: log p(new
    target) at the prompt rises by more than a nat."""
    model, _, tok = load_tiny_mixed()
    kw = {**KW, "steps": 20, "weight_decay": 0.0, "kl_factor": 0.0}
    edit = ci.rome_edit(model, FACT, " Rome", layer=1, expert=expert, **kw)
    ids = tok(FACT.prompt, return_tensors="pt")["input_ids"]
    rome = tok(" Rome")["input_ids"][0]
    with torch.no_grad():
        before = float(model(ids)[0, -1].log_softmax(-1)[rome])
        with edit:
            after = float(model(ids)[0, -1].log_softmax(-1)[rome])
    assert after > before + 1.0, (edit.losses, before, after)


def test_the_shared_expert_gets_the_same_rank_one_update():
    """``expert="shared"``: k*, C and the left vector on the shared expert's neurons (after the routed
    ones); only its down projection moves, by the update written by hand into plain transformers'
    shared expert; leaving the block restores it exactly."""
    model, plain, tok, edit = _edit("shared")
    cols = slice(E * DE, W)
    assert edit.expert == "shared" and not bool(edit.key[: E * DE].any()) and not bool(edit.left[: E * DE].any())
    C, _ = second_moment(model, 1, texts=TEXTS, neurons=cols)
    full, _ = second_moment(model, 1, texts=TEXTS)
    assert torch.allclose(C, full[cols, cols], rtol=1e-5, atol=1e-7)
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    ids = tok(FACT.prompt, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        down = plain.model.layers[1].mlp.shared_experts.down_proj.weight  # [d_model, d_shared]
        old = down.clone()
        down += torch.outer(edit.delta, edit.left[cols])
        try:
            with edit:
                changed = {n for n, p in model.named_parameters() if not torch.equal(p, params[n])}
                assert [n.replace("._original_component", "") for n in changed] == [
                    "model.layers.1.mlp.shared_experts.down_proj.weight"
                ]
                torch.testing.assert_close(
                    down_projection(model, 1).apply(edit.key[None])[0], edit.value, atol=1e-4, rtol=1e-4
                )
                torch.testing.assert_close(model(ids), plain(ids).logits, atol=1e-5, rtol=1e-4)
        finally:
            down.copy_(old)
    assert all(torch.equal(p, params[n]) for n, p in model.named_parameters())


def test_shared_expert_edit_refused_where_there_is_none():
    from capinterp.testing.family_checks._models import load_pair

    model = _edit()[0]
    with pytest.raises(ValueError, match="expert must be an expert index, 'shared' or None"):
        ci.rome_edit(model, FACT, " Rome", layer=1, expert="common", **KW)
    with pytest.raises(ValueError, match=r"second_moment_matrix must be \[48, 48\]"):
        ci.rome_edit(model, FACT, " Rome", layer=1, expert="shared", second_moment_matrix=torch.eye(W), **KW)
    mixtral = load_pair("mixtral")[2]
    with pytest.raises(ValueError, match="expert='shared': layer 1 has no shared expert"):
        ci.rome_edit(mixtral, FACT, " Rome", layer=1, expert="shared", **KW)


# the families whose first layer with a shared expert can reach the matrix check's answer (in the mixed
# families that layer is the last: an edit at the subject there reaches no later token, EditUnreachable)
SHARED = [
    "qwen2_moe",
    "hunyuan_v1_moe",
    "llama4_text",
    "qwen3_next",
    "qwen3_5_moe_text",
    "granitemoehybrid",
    "nemotron_h",
]


@pytest.mark.parametrize("family", SHARED)
def test_shared_expert_edit_matches_the_hand_written_reference(family):
    """The family matrix's ROME check with ``expert="shared"``: k*, delta and the left vector equal the
    HF-hook recomputation on the shared expert's neurons, and the edited log-probs equal those of the
    plain transformers model with the update written into its shared expert by hand."""
    from capinterp.testing.family_checks.rome import check_rome_edit

    check_rome_edit(family, expert="shared")
