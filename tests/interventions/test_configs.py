"""The intervention configs: validation naming the field, presets equal to the former keyword
defaults, and the keyword form and the config form giving identical results on the tiny model."""

import pandas as pd
import pytest
import torch
from planting import PLANTED

from capinterp.data import Example
from capinterp.interventions.configs import (
    EDIT_DAI,
    EDIT_SIGNED,
    FINETUNE_CNL,
    ROME_GPT2_XL,
    EditConfig,
    FinetuneConfig,
    RomeConfig,
)
from capinterp.interventions.editing import edit_knowledge
from capinterp.interventions.finetune import finetune
from capinterp.interventions.rome import rome_edit
from capinterp.units.neurons import NeuronSet

TEXTS = [f"Story {i}: the river runs past the old mill and {i} sheep graze." for i in range(12)]
FACT = Example(
    "The Eiffel Tower is located in the city of", " Paris", {"subject": "Eiffel Tower", "target_new": " Rome"}
)
TOY = [Example(f"{a}+{b}=", "7") for a, b in [(3, 4), (5, 2), (1, 6), (2, 5)]]


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CAPINTERP_CACHE", str(tmp_path / "cache"))


@pytest.mark.parametrize(
    ("cls", "field", "bad"),
    [
        (RomeConfig, "steps", 0),
        (RomeConfig, "steps", 1.5),
        (RomeConfig, "lr", 0.0),
        (RomeConfig, "lr", float("nan")),
        (RomeConfig, "clamp", -1.0),
        (RomeConfig, "kl_factor", -0.1),
        (RomeConfig, "weight_decay", float("inf")),
        (RomeConfig, "ridge", -1e-3),
        (RomeConfig, "n_prefixes", -1),
        (RomeConfig, "prefix_tokens", 0),
        (EditConfig, "lambdas", (1.0,)),
        (EditConfig, "lambdas", "18"),
        (EditConfig, "lambdas", (1.0, -8.0)),
        (EditConfig, "direction", "sideways"),
        (EditConfig, "signed", 1),
        (EditConfig, "batch_size", 0),
        (FinetuneConfig, "lr", 0.0),
        (FinetuneConfig, "lr", {"located": -1.0}),
        (FinetuneConfig, "lr", True),
        (FinetuneConfig, "epochs", 0),
        (FinetuneConfig, "epochs", 1.5),
        (FinetuneConfig, "batch_size", 0),
        (FinetuneConfig, "eval_batch_size", -2),
    ],
)
def test_bad_value_is_refused_naming_the_field(cls, field, bad):
    with pytest.raises((ValueError, TypeError), match=field):
        cls(**{field: bad})
    with pytest.raises((ValueError, TypeError), match=field):
        cls().replace(**{field: bad})  # a copy is validated again


def test_presets_are_the_former_keyword_defaults():
    """The defaults ``rome_edit``, ``edit_knowledge`` / ``edit_table`` and ``finetune`` had as keywords."""
    assert RomeConfig() == ROME_GPT2_XL
    assert (ROME_GPT2_XL.steps, ROME_GPT2_XL.lr, ROME_GPT2_XL.kl_factor) == (20, 0.5, 0.0625)
    assert (ROME_GPT2_XL.weight_decay, ROME_GPT2_XL.clamp, ROME_GPT2_XL.ridge) == (0.5, 4.0, 1e-3)
    assert (ROME_GPT2_XL.n_prefixes, ROME_GPT2_XL.prefix_tokens) == (5, 8)
    assert EditConfig() == EDIT_SIGNED == EditConfig(lambdas=(1.0, 8.0), direction="unembed", signed=True)
    assert EDIT_SIGNED.replace(signed=False) == EDIT_DAI and EDIT_SIGNED.batch_size == 16
    assert FinetuneConfig() == FINETUNE_CNL == FinetuneConfig(lr=1e-5, epochs=1, batch_size=8, eval_batch_size=16)


def test_finetune_config_copies_an_lr_mapping():
    lrs = {"located": 1e-2}
    cfg = FinetuneConfig(lr=lrs)
    lrs["located"] = -1.0
    assert cfg.lr == {"located": 1e-2}


def test_unknown_keyword_and_wrong_config_type_are_refused(tiny, monkeypatch):
    from capinterp.interventions import rome

    monkeypatch.setattr(rome, "_optimise", lambda *a, **k: pytest.fail("work started"))
    with pytest.raises(TypeError, match="stepz"):
        rome_edit(tiny, FACT, layer=1, texts=TEXTS, stepz=3)
    with pytest.raises(TypeError, match="RomeConfig"):
        rome_edit(tiny, FACT, layer=1, texts=TEXTS, config=EditConfig())
    with pytest.raises(ValueError, match="steps"):
        rome_edit(tiny, FACT, layer=1, texts=TEXTS, config=RomeConfig(), steps=0)
    with pytest.raises(TypeError, match="epoch"):
        finetune(tiny, TOY, arms=("full",), epoch=2, progress=False)
    with pytest.raises(TypeError, match="EditConfig"):
        edit_knowledge(tiny, [FACT], neurons=_located(tiny), config=RomeConfig())


def _located(model):
    return NeuronSet.from_indices(PLANTED, model.cfg.n_layers, model.cfg.d_mlp)


def _rome_numbers(edit):
    return [edit.key, edit.value, edit.delta, edit.left, torch.tensor(edit.losses)], edit.params


def test_rome_keyword_and_config_forms_agree(tiny):
    common = dict(layer=1, texts=TEXTS, prefixes=["A day. "])
    kw = rome_edit(tiny, FACT, **common, steps=4, lr=0.3, kl_factor=0.1, weight_decay=0.2, clamp=8.0, ridge=0.01)
    cfg = RomeConfig(steps=4, lr=0.3, kl_factor=0.1, weight_decay=0.2, clamp=8.0, ridge=0.01)
    by_config = rome_edit(tiny, FACT, **common, config=cfg)
    mixed = rome_edit(tiny, FACT, **common, config=cfg.replace(steps=2, ridge=1.0), steps=4, ridge=0.01)
    default = rome_edit(tiny, FACT, **common, steps=4)  # different settings, different numbers
    want, params = _rome_numbers(kw)
    for other in (by_config, mixed):
        got, got_params = _rome_numbers(other)
        assert all(torch.equal(a, b) for a, b in zip(want, got)) and got_params == params
    assert not torch.equal(default.left, kw.left)


def test_edit_knowledge_keyword_and_config_forms_agree(tiny):
    ns = _located(tiny)
    fact = [
        Example("The Eiffel Tower is located in the city of", " Paris"),
        Example("The Eiffel Tower is in", " Paris"),
    ]
    common = dict(mode="update", new_target=" Rome", neurons=ns, unrelated=TOY[:2], neutral_text=TEXTS[:2])
    kw = edit_knowledge(tiny, fact, **common, lambdas=(0.5, 4.0), direction="embed", signed=False, batch_size=1)
    cfg = EditConfig(lambdas=(0.5, 4.0), direction="embed", signed=False, batch_size=1)
    by_config = edit_knowledge(tiny, fact, **common, config=cfg)
    default = edit_knowledge(tiny, fact, **common)
    assert kw.params == by_config.params and pd.Series(kw.metrics).equals(pd.Series(by_config.metrics))
    for layer, (idx, rows) in kw.values.items():
        assert torch.equal(idx, by_config.values[layer][0]) and torch.equal(rows, by_config.values[layer][1])
        assert not torch.equal(rows, default.values[layer][1])


def test_finetune_keyword_and_config_forms_agree(tiny):
    ns = _located(tiny)
    common = dict(neurons=ns, arms=("located", "random"), seed=1, progress=False)
    kw = finetune(tiny, TOY, **common, lr={"located": 1e-2, "random": 2e-2}, epochs=2, batch_size=2)
    cfg = FinetuneConfig(lr={"located": 1e-2, "random": 2e-2}, epochs=2, batch_size=2)
    by_config = finetune(tiny, TOY, **common, config=cfg)
    assert kw.history.equals(by_config.history) and kw.config == by_config.config
    cols = [c for c in kw.table.columns if c not in ("train_s", "s_per_epoch")]
    assert kw.table[cols].equals(by_config.table[cols])
    other = finetune(tiny, TOY, **common, config=cfg.replace(lr=1e-3))
    assert not other.history["loss"].equals(kw.history["loss"])


def test_configs_equal_and_hash_by_value():
    from capinterp.interventions.configs import EDIT_SIGNED, EditConfig, FinetuneConfig

    assert EditConfig(lambdas=[1, 8]) == EDIT_SIGNED and hash(EditConfig(lambdas=[1, 8])) == hash(EDIT_SIGNED)
    lr = {"located": 1e-4, "full": 1e-5}
    a, b = FinetuneConfig(lr=lr), FinetuneConfig(lr=dict(reversed(list(lr.items()))))
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    lr["located"] = 1.0  # the caller's dict changing later changes nothing
    assert a.lr["located"] == 1e-4
    with pytest.raises(TypeError):
        a.lr["located"] = 2.0  # type: ignore[index]
