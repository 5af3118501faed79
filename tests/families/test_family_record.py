"""The per-model family record: facts read from each family's own config, refusals at load,
and capinterp's logits equal to plain transformers' on every dense family."""

from __future__ import annotations

import pytest
import torch

import capinterp as ci
from capinterp.arch.family import UnsupportedFamily, family_of
from capinterp.arch.forward import logits_at
from capinterp.arch.tiny import TINY_FAMILIES, TINY_REFUSED, tiny_hf

MOE = tuple(f for f, kw in TINY_FAMILIES.items() if any("expert" in k and v for k, v in kw.items()))
DENSE = tuple(f for f in TINY_FAMILIES if f not in MOE)


def _load(family: str):
    hf, tok = tiny_hf(family)
    return hf, tok, ci.load_model(hf, tokenizer=tok)


@pytest.mark.parametrize("family", DENSE)
def test_dense_family_logits_match_transformers(family):
    """log p of every next token through capinterp's hand-built logit path equals plain transformers' (1e-6 relative)."""
    hf, tok, model = _load(family)
    ids = tok(["3+4=7 The Eiffel Tower is in", "Rome is the capital of"], return_tensors="pt", padding=True)
    n = ids["attention_mask"].sum(1)
    with torch.no_grad():
        ref = hf(**ids).logits.double().log_softmax(-1)
    for b in range(2):
        pos = int(n[b]) - 1
        got = logits_at(model, ids["input_ids"][b : b + 1, : pos + 1], torch.tensor([pos])).double().log_softmax(-1)
        want = ref[b, pos]
        rel = ((got[0] - want).abs() / want.abs().clamp_min(1.0)).max().item()
        assert rel < 1e-5, (family, rel)


@pytest.mark.parametrize("family", DENSE)
def test_ffn_width_from_config(family):
    """Neurons per layer are the config's FFN width (96 = 3 x d_model), not the bridge's 4 x d_model guess;
    Gemma 4's double-wide MLP (its KV-sharing last layer) is the axis, the other layers padded onto it."""
    _, _, model = _load(family)
    fam = family_of(model)
    want = 128 if family in ("bloom", "mpt") else 192 if family == "gemma4_text" else 96  # bloom, mpt: 4 x d_model
    assert fam.d_mlp == want == model.cfg.d_mlp
    assert ci.arch.model.neuron_shape(model) == (fam.n_layers, want)
    if family == "gemma4_text":
        assert fam.layer_widths == (96, 96, 192)
        assert fam.valid_neurons().sum(1).tolist() == [96, 96, 192]


@pytest.mark.parametrize(
    ("size", "multiplier", "step", "adjust"),
    [
        (12288, 1.0, 256, True),
        (4608, 1.5, 256, True),
        (6656, 0.75, 128, True),
        (1000, 1.0, 96, True),
        (96, 1.0, 64, False),
    ],
)
def test_lfm2_ffn_width_is_its_modules(size, multiplier, step, adjust):
    """LFM2 sizes its FFN from intermediate_size (2/3 of it, times a multiplier, rounded up to a
    multiple; released LFM2-1.2B: 12288 -> 8192): the record's width equals transformers' own module's."""
    from transformers import Lfm2Config
    from transformers.models.lfm2.modeling_lfm2 import Lfm2MLP

    from capinterp.arch.family import _ffn_width

    cfg = Lfm2Config(
        hidden_size=64,
        intermediate_size=size,
        block_ffn_dim_multiplier=multiplier,
        block_multiple_of=step,
        block_auto_adjust_ff_dim=adjust,
    )
    assert _ffn_width(cfg, 64) == Lfm2MLP(cfg).w2.in_features


def test_multipliers_read_from_config():
    _, _, granite = _load("granite")
    fam = family_of(granite)
    assert (fam.logit_multiplier, fam.embedding_multiplier, fam.residual_multiplier) == (0.25, 2.0, 0.5)
    _, _, cohere = _load("cohere")
    assert family_of(cohere).logit_multiplier == 0.5 and family_of(cohere).parallel_block


@pytest.mark.parametrize("family", ["gptj", "gpt_neox", "phi", "codegen", "falcon", "cohere"])
def test_parallel_blocks_flagged(family):
    assert family_of(_load(family)[2]).parallel_block


def _one_down(layer: torch.nn.Module) -> torch.nn.Linear:
    """A dense decoder layer's FFN down projection, by its transformers name (down_proj, or w2: LFM2)."""
    mlp = getattr(layer, "mlp", None) or getattr(layer, "feed_forward", None) or layer.mixer  # NemotronH: one sublayer
    return getattr(mlp, "down_proj", None) or getattr(mlp, "w2", None)


def _dense_widths(hf) -> list[int | None]:
    """Per decoder layer, read from transformers' modules: None for an MoE layer (it holds an
    'experts' module), else its dense MLP's number of neurons (the down projection's inputs)."""
    out: list[int | None] = []
    for layer in hf.model.layers:
        sparse = any(isinstance(getattr(m, "experts", None), torch.nn.Module) for m in layer.modules())
        down = None if sparse else _one_down(layer)  # none in NemotronH's mixer layers: 0 neurons
        out.append(None if sparse else int(down.in_features) if down is not None else 0)
    return out


@pytest.mark.parametrize("family", MOE)
def test_moe_loads_with_expert_neurons(family):
    """An MoE model loads; an expert layer's neurons are every expert's (plus the shared expert's),
    on hook_post, and only the routed experts' neurons are non-zero on a token (top_k experts of
    d_expert). A dense layer (the released layouts: dense layers first) has its transformers MLP's
    neurons first on that axis, then padding that stays exactly 0."""
    hf, tok = tiny_hf(family)
    widths = _dense_widths(hf)
    model = ci.load_model(hf, tokenizer=tok)
    moe = family_of(model).moe
    assert moe is not None and model.cfg.d_mlp == moe.n_experts * moe.d_expert + moe.d_shared
    assert any(w is None for w in widths)
    _, cache = model.run_with_cache(tok("1+2=3", return_tensors="pt")["input_ids"])
    for layer, width in enumerate(widths):
        act = cache[f"blocks.{layer}.mlp.hook_post"][0]
        assert act.shape[-1] == moe.width
        if width is not None:
            assert not bool(act[:, width:].any()), f"{family}: layer {layer}'s padding"
            assert width == 0 or bool(act[:, :width].any()), f"{family}: layer {layer}'s neurons"
            continue
        routed = act[:, : moe.n_experts * moe.d_expert].reshape(act.shape[0], moe.n_experts, moe.d_expert)
        active = (routed != 0).any(-1).sum(-1)
        assert (active == moe.top_k).all(), f"{family}: layer {layer}: experts active per token {active.tolist()}"
    assert moe.locate(moe.d_expert + 3) == (1, 3)


def test_moe_families_are_listed():
    assert {"deepseek_v2", "deepseek_v3", "glm4_moe", "granitemoe", "minimax_m2", "afmoe", "laguna", "jetmoe"} <= set(
        MOE
    )
    assert {"phimoe", "hunyuan_v1_moe", "dots1"} <= set(MOE)  # through capinterp.arch.adapters
    assert not set(MOE) & set(TINY_REFUSED)


# dense layer 0, MoE layer 1: the released layouts of TINY_FAMILIES, and Qwen2-MoE's mlp_only_layers
RELEASED_MIXED = (
    "deepseek_v2",
    "deepseek_v3",
    "glm4_moe",
    "glm4_moe_lite",
    "ernie4_5_moe",
    "afmoe",
    "laguna",
    "dots1",
    "lfm2_moe",  # its dense layer names its projections w1 / w3 / w2 and no activation (SiLU in its forward)
)
MIXED = {**{f: {} for f in RELEASED_MIXED}, "qwen2_moe": dict(mlp_only_layers=[0], intermediate_size=96)}


@pytest.mark.parametrize("family", sorted(MIXED))
def test_moe_with_dense_layers_loads_and_matches_transformers(family):
    """Dense and expert layers mixed in one model load (no refusal): each layer's width is its
    transformers FFN's, and the logits equal plain transformers' (1e-5 of the largest)."""
    hf, tok = tiny_hf(family, **MIXED[family])
    widths = _dense_widths(hf)
    assert widths[0] is not None and widths[-1] is None, f"{family}: the tiny model is not dense-then-MoE"
    ids = tok("3+4=7 The Eiffel Tower is in", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        want = hf(ids).logits
    model = ci.load_model(hf, tokenizer=tok)
    fam = family_of(model)
    assert fam.layer_widths == tuple(w if w is not None else fam.moe.width for w in widths)
    with torch.no_grad():
        got = model(ids)
    assert float((got - want).abs().max()) <= 1e-5 * float(want.abs().max())


@pytest.mark.parametrize(
    ("family", "overrides", "width", "axis"),
    [
        ("qwen2_moe", dict(mlp_only_layers=[0]), 5632, r"256 \(4 x 48 \+ 64 shared\)"),  # transformers' default width
        ("deepseek_v2", dict(intermediate_size=300), 300, r"240 \(4 x 48 \+ 48 shared\)"),
    ],
)
def test_dense_layer_wider_than_the_experts_refused_at_load(family, overrides, width, axis):
    """A dense layer with more neurons than an expert layer's axis cannot be padded onto it: refused, with the reason."""
    hf, tok = tiny_hf(family, **overrides)
    with pytest.raises(
        UnsupportedFamily,
        match=f"^{family} .*layer 0: the dense FFN has {width} neurons, more than an expert layer's {axis}",
    ):
        ci.load_model(hf, tokenizer=tok)


def test_dense_layer_not_gated_refused():
    """A dense layer between expert layers that is no MLP (no up projection) is refused, naming the layer."""
    from capinterp.arch import dense_layers

    hf, tok = tiny_hf("deepseek_v2")
    model = ci.load_model(hf, tokenizer=tok)
    mlp = model.blocks[0].mlp
    while isinstance(getattr(mlp, "original_component", None), torch.nn.Module):
        mlp = mlp.original_component  # the transformers MLP the bridge wraps
    del mlp.up_proj  # neither gated nor plain
    with pytest.raises(UnsupportedFamily, match="^deepseek_v2 .*layer 0: a dense layer that is not an MLP"):
        dense_layers.dense_block(model, 0, family_of(model).d_mlp, family_of(model).moe)


def test_dense_layer_whose_projection_is_no_linear_refused():
    """A dense layer whose down projection is some other module (no ``in_features``, a weight of another
    layout) is refused as no MLP, naming the layer, instead of failing on a missing attribute."""
    from capinterp.arch import dense_layers

    class Transposed(torch.nn.Module):  # the same map, its weight stored [in, out]
        def __init__(self, lin: torch.nn.Linear) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(lin.weight.detach().T.clone())

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x @ self.w

    hf, tok = tiny_hf("deepseek_v2")
    model = ci.load_model(hf, tokenizer=tok)
    mlp = model.blocks[0].mlp
    while isinstance(getattr(mlp, "original_component", None), torch.nn.Module):
        mlp = mlp.original_component
    mlp.down_proj = Transposed(mlp.down_proj)
    with pytest.raises(UnsupportedFamily, match="^deepseek_v2 .*layer 0: a dense layer that is not an MLP"):
        dense_layers.dense_block(model, 0, family_of(model).d_mlp, family_of(model).moe)


def test_dense_layer_computing_something_else_refused_at_load(monkeypatch):
    """A dense MLP whose transformers forward is not down(act(gate(x)) * up(x)) (here: doubled) is
    refused at load, never served with wrong numbers."""
    hf, tok = tiny_hf("deepseek_v2")
    dense = hf.model.layers[0].mlp  # this layer only (the shared expert is the same class)
    real = dense.forward
    monkeypatch.setattr(dense, "forward", lambda x: 2.0 * real(x))
    with pytest.raises(UnsupportedFamily, match="^deepseek_v2 .*layer 0: the dense layer's output is not .*differs by"):
        ci.load_model(hf, tokenizer=tok)


def test_dense_layer_with_another_activation_than_silu_refused_at_load(monkeypatch):
    """LFM2-MoE's dense layer names no activation (SiLU inside its forward), so capinterp takes SiLU;
    a w1 / w3 / w2 MLP whose forward uses another one (here GELU) is refused at load."""
    hf, tok = tiny_hf("lfm2_moe")
    dense = hf.model.layers[0].feed_forward
    gelu = torch.nn.functional.gelu
    monkeypatch.setattr(dense, "forward", lambda x: dense.w2(gelu(dense.w1(x)) * dense.w3(x)))
    with pytest.raises(UnsupportedFamily, match="^lfm2_moe .*layer 0: the dense layer's output is not .*differs by"):
        ci.load_model(hf, tokenizer=tok)


REFUSED_WHY = {
    "hrm_text": r"the TransformerBridge maps no per-layer blocks",
}


@pytest.mark.parametrize("family", sorted(TINY_REFUSED))
def test_unservable_moe_family_refused_at_load_naming_it(family):
    hf, tok = tiny_hf(family)
    with pytest.raises(UnsupportedFamily, match=f"^{family} .*{REFUSED_WHY[family]}"):
        ci.load_model(hf, tokenizer=tok)


def test_moe_block_computing_something_else_refused_at_load(monkeypatch):
    """A block whose output is not the router-weighted sum of its experts (here: transformers'
    Mixtral block with its output doubled) is refused at load, never served with wrong numbers."""
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

    real = MixtralSparseMoeBlock.forward
    monkeypatch.setattr(MixtralSparseMoeBlock, "forward", lambda self, h: 2.0 * real(self, h))
    hf, tok = tiny_hf("mixtral")
    with pytest.raises(UnsupportedFamily, match="mixtral.*layer 0.*not the router-weighted sum.*differs by"):
        ci.load_model(hf, tokenizer=tok)


def test_bridge_forward_failure_refused_at_load(monkeypatch):
    """A model whose bridge forward fails at load is refused naming the family and the error."""
    from transformers.models.llama.modeling_llama import LlamaMLP

    def broken(self, x):
        raise RuntimeError("no such kernel")

    monkeypatch.setattr(LlamaMLP, "forward", broken)
    hf, tok = tiny_hf("llama")
    with pytest.raises(UnsupportedFamily, match="llama .*forward fails.*RuntimeError: no such kernel"):
        ci.load_model(hf, tokenizer=tok)


def test_wrong_logit_path_refused_at_load(monkeypatch):
    """A family whose final logits need a step the record does not know is refused, not silently wrong."""
    hf, tok = tiny_hf("granite")
    monkeypatch.setattr("capinterp.arch.family._get", _forget("logits_scaling"))
    with pytest.raises(UnsupportedFamily, match="granite.*differ from the model's own"):
        ci.load_model(hf, tokenizer=tok)


def _forget(field: str):
    from capinterp.arch import family

    real = family._get

    def get(cfg, *names, default=None):
        return real(cfg, *[n for n in names if n != field], default=default) if names != (field,) else default

    return get


def test_bridge_own_hooks_are_not_the_users():
    """OPT's bridge attaches hooks of its own at load; only hooks a caller adds count as attached."""
    from capinterp.arch.model import user_hooks

    _, _, model = _load("opt")
    assert model.capinterp_own_hooks  # the adapter's own: present at load
    assert user_hooks(model) == []
    model.add_hook("blocks.1.mlp.hook_post", lambda x, hook: x)
    try:
        found = user_hooks(model)  # hook_post and the names the bridge aliases to the same hook point
        assert "blocks.1.mlp.hook_post" in found and all(n.startswith("blocks.1.mlp.") for n in found)
    finally:
        model.reset_hooks(including_permanent=False)
    assert user_hooks(model) == []


def test_final_norm_on_the_embeddings_fires_ln_final_once():
    """NanoChat calls its final norm on the embeddings too: capinterp finds that at load, and
    ln_final.hook_in then carries only the last layer's output (HF's, read by a hook on a plain copy),
    also on a deep copy of the model; other families are unaffected."""
    from capinterp.core.params import copy_model

    hf, tok, model = _load("nanochat")
    plain = tiny_hf("nanochat")[0]
    assert family_of(model).embedding_norm and not family_of(_load("llama")[2]).embedding_norm
    ids = tok("3+4=7 The Eiffel Tower is in", return_tensors="pt")["input_ids"]
    last: list[torch.Tensor] = []
    h = plain.model.layers[-1].register_forward_hook(
        lambda m, a, out: last.append(out[0] if isinstance(out, tuple) else out)
    )
    with torch.no_grad():
        want = plain(ids).logits[0, -1]
    h.remove()
    for m in (model, copy_model(model)):
        fired: list[torch.Tensor] = []
        m.run_with_hooks(ids, fwd_hooks=[("ln_final.hook_in", lambda x, hook: fired.append(x.detach()))])
        assert len(fired) == 1 and torch.allclose(fired[0], last[0], atol=1e-5)
        got = logits_at(m, ids, torch.tensor([ids.shape[1] - 1]))[0]
        assert (got - want).abs().max().item() < 1e-4


def test_capinterp_adapters_never_replace_the_bridges_own(monkeypatch):
    """capinterp.arch.adapters registers an adapter only for a class the bridge has none for: one it
    supports keeps the bridge's adapter; registering twice is a no-op; PhiMoE loads through capinterp's."""
    from transformer_lens.factories import architecture_adapter_factory as factory

    from capinterp.arch import adapters

    ours = adapters.EXTRA_ARCHITECTURES["PhimoeForCausalLM"]
    before = factory.SUPPORTED_ARCHITECTURES["LlamaForCausalLM"]
    monkeypatch.setitem(adapters.EXTRA_ARCHITECTURES, "LlamaForCausalLM", ours)
    adapters.register()
    adapters.register()
    assert factory.SUPPORTED_ARCHITECTURES["LlamaForCausalLM"] is before
    assert factory.ArchitectureAdapterFactory._adapters["LlamaForCausalLM"] is before
    hf, tok = tiny_hf("phimoe")
    model = ci.load_model(hf, tokenizer=tok)
    assert type(model.adapter).__name__ == "PhimoeAdapter"


@pytest.mark.parametrize(
    ("family", "fields", "why"),
    [
        ("nemotron_h", dict(layers_block_type=["mamba", "attention", "mlp", "moe"]), None),  # capinterp splits
        ("zamba2", dict(layers_block_type=["mamba", "hybrid"]), "several layers share"),
        ("granitemoehybrid", dict(layer_types=["mamba", "attention"]), None),  # Mamba: served
        ("falcon_h1", {}, None),
    ],
)
def test_layer_kinds_read_from_config(family, fields, why):
    """Layer kinds come from transformers' config (its layer_types vocabulary); kinds capinterp does not
    serve are refused naming why, before any model is built."""
    from dataclasses import replace

    from transformers import AutoConfig

    from capinterp.arch.family import _hybrid_layers, check_supported

    cfg = AutoConfig.for_model(family, num_hidden_layers=len(next(iter(fields.values()), [0, 0])), **fields)
    kinds = _hybrid_layers(cfg)
    assert kinds, f"{family}: no layer kinds besides attention read from {cfg.layer_types}"
    fam = replace(family_of(_load("llama")[2]), name=family, hybrid_layers=kinds)
    if why is None:
        check_supported(fam)
    else:
        with pytest.raises(UnsupportedFamily, match=f"^{family} .*{why}"):
            check_supported(fam)


@pytest.mark.parametrize(
    ("family", "fields"),
    [
        ("mamba", dict(state_size=8)),
        ("recurrent_gemma", dict(num_attention_heads=4, lru_width=32, intermediate_size=96, head_dim=8)),
    ],
)
def test_model_without_ffn_hook_refused_at_load_saying_so(family, fields):
    """A state-space model (Mamba) and one whose FFN the bridge does not map as 'mlp' (RecurrentGemma's
    mlp_block) are refused at load, naming the family and the missing FFN hook."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from capinterp.arch.tiny import tiny_tokenizer

    tok = tiny_tokenizer()
    cfg = AutoConfig.for_model(family, vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, **fields)
    hf = AutoModelForCausalLM.from_config(cfg).eval()
    with pytest.raises(UnsupportedFamily, match=f"^{family} .*exposes no FFN neurons.*blocks.0.mlp.hook_post"):
        ci.load_model(hf, tokenizer=tok)


@pytest.mark.parametrize(
    ("family", "config", "loaded"),
    [
        ("gemma4_text", (96, ()), (192, (96, 96, 192))),  # the widest MLP is the axis, the others padded
        ("deepseek_v2", (240, ()), (240, (96, 240))),  # a dense layer before the expert layers
        ("llama4_text", None, None),  # a shared expert the config does not name, read from the modules
        ("nanochat", (96, ()), (96, ())),  # the final norm also on the embeddings: found by the first forward
    ],
)
def test_record_is_built_once_from_config_modules_and_first_forward(family, config, loaded):
    """The loaded record is read_family's, in one step, from the configs plus the neuron axis the layers gave
    (install's return) and the first forward's final-norm order; the config alone gives another axis where the
    modules say more, and install serves the layers without touching the record."""
    from capinterp.arch.family import NeuronAxis, read_family

    _, _, model = _load(family)
    fam = family_of(model)
    axis = NeuronAxis(fam.d_mlp, fam.moe, fam.layer_widths)
    assert read_family(model, axis, embedding_norm=fam.embedding_norm) == fam
    bare = read_family(model)
    if config is not None:
        assert (bare.d_mlp, bare.layer_widths) == config and (fam.d_mlp, fam.layer_widths) == loaded
    else:
        assert bare.moe is not None and fam.moe is not None and bare.moe.d_shared == 0 < fam.moe.d_shared
    assert fam.embedding_norm == (family == "nanochat") and not bare.embedding_norm
    assert not {"fused_qkv", "attention_multiplier"} & set(fam.__dataclass_fields__)  # read by no one: removed
