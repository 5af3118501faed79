"""NemotronH (one sublayer per layer: Mamba-2, attention, MLP or experts alone), served by splitting each
layer into a mixer slot and an FFN slot (capinterp.arch.one_sublayer): the mixer layers' FFN has no
neurons. The family matrix checks every method against plain transformers (rows nemotron_h,
nemotron_h_dense); this file checks the layout itself and the refusals."""

from __future__ import annotations

import copy
import functools
import warnings

import pytest
import torch

import capinterp as ci
from capinterp.arch.family import UnsupportedFamily
from capinterp.arch.model import valid_neurons
from capinterp.arch.tiny import TINY_FAMILIES, tiny_hf
from capinterp.core.example import Example
from capinterp.interventions.rome import rome_edit
from capinterp.testing.family_checks._plain import plain_params

FAMILIES = ("nemotron_h", "nemotron_h_dense")
FACT = Example(prompt="The Eiffel Tower is in the city of", target=" Paris", meta={"subject": "The Eiffel Tower"})


def _load(family: str, **overrides):
    hf, tok = tiny_hf(family, **overrides)
    plain = copy.deepcopy(hf)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ci.load_model(hf, tokenizer=tok), plain, tok


@functools.cache
def _pair(family: str):
    return _load(family)


def _widths(family: str) -> list[int]:
    """Each layer's neurons from the config: 0 on a mixer layer, the MLP's width, the experts' and shared expert's."""
    kw = TINY_FAMILIES[family]
    moe = kw.get("n_routed_experts", 0) * kw.get("moe_intermediate_size", 0) + kw.get(
        "moe_shared_expert_intermediate_size", 0
    )
    per_kind = {"mlp": kw["intermediate_size"], "moe": moe}
    return [per_kind.get(k, 0) for k in kw["layers_block_type"]]


@pytest.mark.parametrize("family", FAMILIES)
@torch.no_grad()
def test_every_layer_has_an_ffn_slot_the_mixer_layers_with_no_neurons(family):
    model, plain, tok = _pair(family)
    widths = _widths(family)
    fam = ci.family_of(model)
    assert list(fam.layer_widths) == widths and fam.d_mlp == max(widths)
    assert int(valid_neurons(model).sum()) == sum(widths)
    ids = tok(FACT.prompt, return_tensors="pt")["input_ids"]
    want = plain(ids).logits
    logits, cache = model.run_with_cache(ids)
    assert float((logits - want).abs().max()) <= 1e-5 * float(want.abs().max())
    for layer, width in enumerate(widths):
        neurons = cache[f"blocks.{layer}.mlp.hook_post"]
        assert neurons.shape[-1] == fam.d_mlp
        assert not neurons[..., width:].any(), f"layer {layer}: padding past its {width} neurons is not 0"
        if width:  # an FFN layer: its contribution is the layer's whole update of the residual stream
            got = cache[f"blocks.{layer}.hook_mlp_out"]
            assert (
                float(
                    (cache[f"blocks.{layer}.hook_resid_post"] - cache[f"blocks.{layer}.hook_resid_pre"] - got)
                    .abs()
                    .max()
                )
                < 1e-5
            )
            assert neurons[..., :width].abs().sum() > 0
        else:  # a mixer layer: its FFN adds nothing
            assert not cache[f"blocks.{layer}.hook_mlp_out"].any()


@pytest.mark.parametrize("family", FAMILIES)
def test_rome_refuses_a_layer_without_neurons_naming_those_with(family):
    model, _, _ = _pair(family)
    ffn = [l for l, w in enumerate(_widths(family)) if w]
    with pytest.raises(ValueError, match=rf"layer 0 of nemotron_h has no FFN neurons.*{ffn}"):
        rome_edit(model, FACT, " Rome", layer=0, texts=["a b c d e f"], steps=1)


@pytest.mark.parametrize("family", FAMILIES)
def test_parameters_keep_their_tensors_under_the_transformers_names(family):
    """The split renames modules (mixer -> mamba / self_attn / mlp, norm -> input_layernorm / pre_ff_layernorm):
    every transformers parameter is still there, once, mapped back to its transformers name."""
    model, plain, _ = _pair(family)
    got = plain_params(model.original_model)
    want = dict(plain.named_parameters())
    assert sorted(got) == sorted(want)
    assert all(torch.equal(got[n], want[n]) for n in want)


def test_latent_experts_value_vectors_are_fc2_of_their_columns():
    """Nemotron 3 Super's latent MoE (row nemotron_h_latent of the matrix checks every method): a routed
    neuron's value vector is fc2_latent_proj's weight times its column of the expert's down projection,
    read by hand from the transformers modules."""
    from capinterp.arch.experts import latent_layers
    from capinterp.arch.weights import down_projection

    model, plain, _ = _pair("nemotron_h_latent")
    assert latent_layers(model) == [1]
    block = plain.model.layers[1].mixer
    fc2, down = block.fc2_latent_proj.weight, block.experts.down_proj  # [d_model, latent], [E, latent, d]
    d = down.shape[2]
    want = torch.stack([fc2 @ down[e, :, j] for e in range(down.shape[0]) for j in range(d)])
    got = down_projection(model, 1).values()
    assert torch.allclose(got[: want.shape[0]], want, atol=1e-6)
    shared = block.shared_experts.down_proj.weight.T
    assert torch.equal(got[want.shape[0] :], shared)


def test_latent_value_writes_reach_only_fc2s_range():
    """A d_model row is in fc2's reach only within its range: a row outside it is refused before anything
    is written; zeroing a row, restoring it and scaling it are written (through the column that fc2 maps
    to the row), and a shared-expert row as given."""
    from capinterp.arch.weights import down_projection

    model, _, _ = _load("nemotron_h_latent")
    proj = down_projection(model, 1)
    before = proj.values()
    with pytest.raises(UnsupportedFamily, match="only within fc2's range"):
        proj.write_rows(torch.tensor([0, 70]), torch.stack([before[0] + 1.0, before[70] * 2]))
    assert torch.equal(proj.values(), before)  # nothing written, the shared row included
    proj.write_rows(torch.tensor([0, 1, 70]), torch.stack([before[0] * 3, torch.zeros_like(before[1]), before[70] * 2]))
    after = proj.values()
    assert torch.allclose(after[0], 3 * before[0], atol=1e-5) and after[1].abs().max() < 1e-6
    assert torch.allclose(after[70], 2 * before[70])
    assert torch.equal(after[2:64], before[2:64])
    proj.write_rows(torch.tensor([1]), before[1:2])  # an erased row restored
    assert torch.allclose(proj.values()[1], before[1], atol=1e-5)


def test_latent_layers_refuse_routed_edits_before_any_work_and_edit_the_shared_expert():
    from capinterp.interventions.editing import edit_knowledge
    from capinterp.testing.family_checks.rome import check_rome_edit

    model, _, _ = _pair("nemotron_h_latent")
    with pytest.raises(UnsupportedFamily, match="ROME at layer 1 would write a routed expert"):
        rome_edit(model, FACT, " Rome", layer=1, texts=["a b c d e f"], steps=1)
    with pytest.raises(UnsupportedFamily, match="edit_knowledge writes new value vectors"):
        edit_knowledge(model, [FACT, FACT], mode="erase")
    check_rome_edit("nemotron_h_latent", expert="shared")  # against the hand-written ROME on transformers


def test_a_plain_mlp_computing_something_else_is_refused(monkeypatch):
    from transformers.models.nemotron_h import modeling_nemotron_h as nh

    forward = nh.NemotronHMLP.forward
    monkeypatch.setattr(nh.NemotronHMLP, "forward", lambda self, x: 2 * forward(self, x))
    with pytest.raises(UnsupportedFamily, match=r"down_proj\(act_fn\(up_proj\(x\)\)\)"):
        _load("nemotron_h_dense")
