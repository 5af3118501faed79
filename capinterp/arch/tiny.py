"""Tiny random models for tests and examples: no network, built in a fraction of a second.

``tiny_llama`` is Llama-shaped (RMSNorm, rotary, gated SiLU MLP, grouped-query attention),
like SmolLM2, so every code path that runs on the packaged models runs on it too.
``tiny_native`` is TransformerLens' own native model (GPT-2-like, ungated GELU MLP).

The tokenizer is a byte-level BPE trained in memory on a fixed corpus (arithmetic and a few
facts) with digits split individually, as the packaged models do. Training is deterministic,
so every process builds the same vocabulary.
"""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from typing import Any

import torch

__all__ = [
    "TINY_FAMILIES",
    "TINY_HYBRID",
    "TINY_REFUSED",
    "TINY_VARIANT_OF",
    "model_type",
    "tiny_hf",
    "tiny_llama_hf",
    "tiny_native_config",
    "tiny_tokenizer",
]

_SPECIALS = ["<unk>", "<s>", "</s>", "<pad>"]


def _corpus() -> list[str]:
    words = (
        "The Eiffel Tower is in the city of Paris . Rome is the capital of Italy . "
        "Berlin is the capital of Germany . Tokyo Japan London England Madrid Spain "
        "Based on the given expression please provide the answer directly Question Answer "
        "Options Is this correct Yes No True False A B C D write Python code for compute "
        "The mother tongue of language speaks plays the position of football basketball "
        "was born in is located in works as a the of and to in on with by"
    )
    lines = [words, "0 1 2 3 4 5 6 7 8 9 + - * / = ? ( ) : , \" ' \n"]
    lines += [f"{a}+{b}={a + b}" for a in range(10) for b in range(10)]
    lines += ["计算 答案 表达式 是 否 请 直接 给出 根据 正确 判断 选项"]
    return lines


@functools.lru_cache(maxsize=4)
def _tokenizer_dir(vocab_size: int) -> str:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=_SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus() * 5, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>"
    )
    # A tokenizer made in memory must be saved and reloaded before TransformerLens accepts it.
    folder = tempfile.mkdtemp(prefix="capinterp-tiny-tok-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)  # loaded tokenizers keep no file open
    fast.save_pretrained(folder)
    return folder


def tiny_tokenizer(vocab_size: int = 512) -> Any:
    """A deterministic BPE tokenizer of ``vocab_size`` tokens (digits split), built locally once, no network."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(_tokenizer_dir(vocab_size))
    tok.padding_side = "right"
    return tok


def tiny_llama_hf(
    n_layers: int = 4,
    d_model: int = 64,
    d_mlp: int = 128,
    n_heads: int = 4,
    n_kv_heads: int = 2,
    n_ctx: int = 512,
    seed: int = 0,
    vocab_size: int = 512,
) -> tuple[Any, Any]:
    """Return ``(hf_model, tokenizer)`` for a randomly initialised tiny Llama (eval mode)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = tiny_tokenizer(vocab_size)
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=d_model,
        intermediate_size=d_mlp,
        num_hidden_layers=n_layers,
        num_attention_heads=n_heads,
        num_key_value_heads=n_kv_heads,
        max_position_embeddings=n_ctx,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=False,
    )
    cfg.architectures = ["LlamaForCausalLM"]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(cfg)
        # Default init (std 0.02) gives near-uniform outputs; a larger scale gives a model
        # whose predictions actually depend on its neurons.
        for _name, p in model.named_parameters():
            if p.dim() == 2:
                torch.nn.init.normal_(p, std=0.15)
    return model.eval(), tok


def tiny_native_config(
    n_layers: int = 2, d_model: int = 32, d_mlp: int = 64, n_heads: int = 4, n_ctx: int = 256, seed: int = 0
) -> Any:
    """The config of a tiny TransformerLens-native model (``n_layers`` x ``d_mlp`` neurons), seeded."""
    from transformer_lens.config import TransformerBridgeConfig

    tok = tiny_tokenizer()
    return TransformerBridgeConfig(
        d_model=d_model,
        n_layers=n_layers,
        n_ctx=n_ctx,
        d_head=d_model // n_heads,
        n_heads=n_heads,
        d_mlp=d_mlp,
        d_vocab=len(tok),
        act_fn="gelu",
        normalization_type="LN",
        seed=seed,
    )


# Per-family settings of :func:`tiny_hf` beyond the common sizes (transformers config field names).
# Every entry builds a 2-layer model with d_model 32, 4 heads (2 KV heads where the family has GQA)
# and an FFN 96 wide (3 x d_model, so a bridge that assumes 4 x d_model is caught).
# a linear-attention layer (gated delta net), then a full-attention one; MoE FFNs with a shared expert
# the gated delta net at the tiny width (transformers' defaults, 16 x 128 key and 32 x 128 value
# heads, made its pure-torch kernel 0.2 s a forward at d_model 64)
_SMALL_DELTA_NET: dict[str, Any] = dict(
    linear_num_key_heads=2, linear_num_value_heads=2, linear_key_head_dim=8, linear_value_head_dim=8
)
_HYBRID: dict[str, Any] = dict(
    moe_intermediate_size=48,
    shared_expert_intermediate_size=64,
    num_experts=4,
    num_experts_per_tok=2,
    head_dim=8,
    layer_types=["linear_attention", "full_attention"],
    **_SMALL_DELTA_NET,
)

# DeepSeek-V3's MoE layout (4 routed experts of 48, one shared, top 2; a dense layer 0 of 96), shared by
# DeepSeek-V2/V3 and dots.llm1; and DeepSeek's multi-head latent attention, whose head_dim is the rotary part
# (set with it: tiny_hf sets fields after the config computed its derived ones)
_DEEPSEEK_MOE: dict[str, Any] = dict(
    moe_intermediate_size=48,
    n_routed_experts=4,
    num_experts_per_tok=2,
    n_shared_experts=1,
    intermediate_size=96,
    first_k_dense_replace=1,
    n_group=1,
    topk_group=1,
)
_MLA: dict[str, Any] = dict(
    kv_lora_rank=16,
    q_lora_rank=16,
    qk_rope_head_dim=4,
    head_dim=4,
    qk_nope_head_dim=4,
    v_head_dim=8,
)


# Granite's four multipliers, drawn away from 1 so that a path forgetting one fails the matrix
_GRANITE_MULTIPLIERS = dict(
    embedding_multiplier=2.0, residual_multiplier=0.5, attention_multiplier=0.3, logits_scaling=4.0
)

# NemotronH's sizes besides its layers (Mamba-2: 4 heads x 16 = 2 x d_model; attention: 4 query heads of 8)
_NEMOTRON_H = dict(head_dim=8, intermediate_size=48, mamba_num_heads=4, mamba_head_dim=16, n_groups=1, ssm_state_size=8)
# NemotronH with experts: the four kinds in the config's default order (Mamba-2, experts, attention, MLP)
_NEMOTRON_H_MOE = dict(
    layers_block_type=["linear_attention", "moe", "full_attention", "mlp"],
    num_hidden_layers=4,
    **_NEMOTRON_H,
    n_routed_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=16,
    moe_shared_expert_intermediate_size=16,
    n_group=1,
    topk_group=1,
)

# Gemma 4's text model: a 4-token window on its sliding layers
_GEMMA4 = dict(intermediate_size=96, head_dim=8, sliding_window=4)

# Gemma 4 E2B / E4B's text model: per-layer embeddings (PLE) beside the residual stream, full-attention
# layers with heads of their own width (the config's per-layer override) and keys equal to values
# (attention_k_eq_v), the last layer reusing layer 1's keys and values (num_kv_shared_layers) with a
# double-wide MLP, every layer's output scaled by its layer_scalar (drawn away from 1 by tiny_hf)
_GEMMA4_E: dict[str, Any] = dict(
    _GEMMA4,
    num_hidden_layers=3,
    layer_types=["sliding_attention", "full_attention", "full_attention"],
    per_layer_config={"01": {"head_dim": 16}, "02": {"head_dim": 16}},
    num_kv_shared_layers=1,
    use_double_wide_mlp=True,
    attention_k_eq_v=True,
    hidden_size_per_layer_input=16,
    vocab_size_per_layer_input=512,
)

# Gemma 4's MoE layers (26B-A4B's shape: no per-layer embeddings, no KV sharing): routed experts beside
# the dense MLP, each branch normalized before the two add (capinterp.arch.branch_experts); the row
# "gemma4_text_moe" of TINY_FAMILIES (overrides of the "gemma4_text" row)
_GEMMA4_MOE: dict[str, Any] = dict(
    num_hidden_layers=2,
    layer_types=["sliding_attention", "full_attention"],
    per_layer_config={},
    num_kv_shared_layers=0,
    use_double_wide_mlp=False,
    hidden_size_per_layer_input=0,
    attention_k_eq_v=True,
    enable_moe_block=True,
    num_experts=4,
    top_k_experts=2,
    moe_intermediate_size=24,
)

TINY_FAMILIES: dict[str, dict[str, Any]] = {
    "llama": dict(intermediate_size=96),
    "mistral": dict(intermediate_size=96, sliding_window=4),  # every layer sliding: a 4-token window bites
    "qwen2": dict(intermediate_size=96),
    "qwen3": dict(intermediate_size=96, head_dim=8),
    "gemma": dict(intermediate_size=96, head_dim=8),
    # sliding windows of 4 tokens, below the check prompts' 6 and 11 tokens, so the window bites
    # (layer types: Gemma 2 sliding then full, Gemma 3 both sliding)
    "gemma2": dict(intermediate_size=96, head_dim=8, sliding_window=4),
    "gemma3_text": dict(intermediate_size=96, head_dim=8, sliding_window=4),
    "gemma4_text": _GEMMA4_E,
    "gemma4_text_moe": {**_GEMMA4_E, **_GEMMA4_MOE},
    # Gemma 3n's text model (E2B / E4B; adapter: capinterp.arch.adapters): AltUp's four residual streams,
    # LAuReL beside attention, per-layer embeddings, the FFN width given per layer, activation sparsity (a
    # Gaussian top-k of the gate) on layer 0, the last layer reusing layer 1's keys and values
    "gemma3n_text": dict(
        num_hidden_layers=3,
        intermediate_size=[96, 96, 96],
        head_dim=8,
        sliding_window=4,
        layer_types=["sliding_attention", "full_attention", "full_attention"],
        hidden_size_per_layer_input=8,
        laurel_rank=4,
        num_kv_shared_layers=1,
        activation_sparsity_pattern=[0.95, 0.0, 0.0],
    ),
    "olmo": dict(intermediate_size=96),
    "olmo2": dict(intermediate_size=96),
    "stablelm": dict(intermediate_size=96),
    "starcoder2": dict(intermediate_size=96, sliding_window=4),  # released checkpoints slide (4096)
    "phi": dict(intermediate_size=96, partial_rotary_factor=0.5),
    "phi3": dict(intermediate_size=96, sliding_window=4),  # Phi-3-mini slides (2047)
    "nemotron": dict(intermediate_size=96),
    "cohere": dict(intermediate_size=96, logit_scale=0.5),
    "granite": dict(intermediate_size=96, **_GRANITE_MULTIPLIERS),
    "gpt2": dict(n_inner=96),
    "gpt_bigcode": dict(n_inner=96),
    "gptj": dict(n_inner=96, rotary_dim=4),
    "codegen": dict(n_inner=96, rotary_dim=4),
    "gpt_neo": dict(intermediate_size=96, attention_types=[[["global", "local"], 1]], num_layers=2, window_size=4),
    "gpt_neox": dict(intermediate_size=96, rotary_pct=0.5),
    "opt": dict(ffn_dim=96, word_embed_proj_dim=32),
    "xglm": dict(ffn_dim=96),
    "falcon": dict(ffn_hidden_size=96),
    "bloom": dict(),  # FFN fixed at 4 x d_model
    "mpt": dict(),  # FFN fixed at 4 x d_model (transformers ignores expansion_ratio)
    # more decoder-only dense families of the bridge (head_dim set: these configs derive it before tiny_hf sets sizes)
    "glm4": dict(intermediate_size=96, head_dim=8),  # fused gate_up, partial rotary, post-attn/post-MLP norms
    "exaone4": dict(  # QK norm, post-norms; a 4-token sliding window on layer 0 so the window bites
        intermediate_size=96, head_dim=8, layer_types=["sliding_attention", "full_attention"], sliding_window=4
    ),
    "ernie4_5": dict(intermediate_size=96, head_dim=8),  # tied embeddings
    "smollm3": dict(intermediate_size=96, head_dim=8, layer_types=["full_attention"] * 2, no_rope_layers=[1, 0]),
    "olmo3": dict(
        intermediate_size=96, head_dim=8, layer_types=["sliding_attention", "full_attention"], sliding_window=4
    ),
    "seed_oss": dict(intermediate_size=96, head_dim=8),  # q/k/v biases
    "apertus": dict(intermediate_size=96, head_dim=8),  # xIELU activation, QK norm, ungated MLP
    "hunyuan_v1_dense": dict(intermediate_size=96, head_dim=8),  # QK norm
    "ministral3": dict(intermediate_size=96, head_dim=8),
    "bitnet": dict(intermediate_size=96, head_dim=8),  # sub-norms before o_proj and down_proj
    "glm": dict(intermediate_size=96, head_dim=8),  # GLM (first generation): fused gate_up, partial rotary
    "arcee": dict(intermediate_size=96, head_dim=8),  # ungated ReLU^2 MLP
    "jais2": dict(intermediate_size=96, head_dim=8),
    "vaultgemma": dict(intermediate_size=96, head_dim=8, sliding_window=4),  # layer 0 sliding, layer 1 full
    # weightless norms, the final norm also on the embeddings (capinterp.arch.embedding_norm), logit soft-cap 15
    "nanochat": dict(intermediate_size=96, head_dim=8),
    # mixture of experts (capinterp.arch.experts): every neuron of every expert on one axis per layer
    "mixtral": dict(intermediate_size=48, num_local_experts=4, num_experts_per_tok=2),
    # hybrids: a linear-attention layer (gated delta net), then a full-attention one
    "qwen3_next": _HYBRID,
    "qwen3_5_moe_text": _HYBRID,
    "qwen3_5_text": dict(
        intermediate_size=96, head_dim=8, layer_types=["linear_attention", "full_attention"], **_SMALL_DELTA_NET
    ),
    # Mamba hybrids ("linear_attention" in transformers' vocabulary for their Mamba layers): a Mamba
    # layer, then an attention layer (Bamba, OLMo-Hybrid's gated delta net, Jamba: dense then MoE)
    "bamba": dict(intermediate_size=96, attn_layer_indices=[1], mamba_n_heads=4, mamba_d_head=16, mamba_d_state=8),
    "olmo_hybrid": dict(
        intermediate_size=96,
        layer_types=["linear_attention", "full_attention"],
        **_SMALL_DELTA_NET,
    ),
    "jamba": dict(
        intermediate_size=48,
        num_experts=4,
        num_experts_per_tok=2,
        attn_layer_period=2,
        attn_layer_offset=1,
        expert_layer_period=2,  # transformers' defaults, as released: dense layer 0, MoE layer 1
        expert_layer_offset=1,
        mamba_d_state=8,
        mamba_dt_rank=4,
    ),
    # Falcon-H1: attention and Mamba side by side in every layer ("hybrid"), muP multipliers all drawn
    # away from 1 (a path that forgot one is caught): logits, embeddings, the FFN's gate and output,
    # attention and SSM inputs and outputs
    "falcon_h1": dict(
        intermediate_size=96,
        mamba_d_ssm=64,
        mamba_n_heads=4,
        mamba_d_head=16,
        mamba_d_state=8,
        lm_head_multiplier=0.5,
        embedding_multiplier=2.0,
        mlp_multipliers=[0.5, 2.0],
        key_multiplier=0.8,
        attention_in_multiplier=1.1,
        attention_out_multiplier=0.7,
        ssm_in_multiplier=0.9,
        ssm_out_multiplier=1.3,
    ),
    # LFM2: a short-convolution layer, then an attention layer; its FFN width is 2/3 of the config's,
    # rounded up to a multiple (144 -> 96 here: a record that reads intermediate_size is caught)
    "lfm2": dict(intermediate_size=144, block_multiple_of=32, layer_types=["conv", "full_attention"]),
    # LFM2-MoE: the same layers, a dense layer 0 (w1 / w3 / w2, as the original Llama) and MoE layer 1
    # whose router adds an expert bias to its scores
    "lfm2_moe": dict(
        intermediate_size=96,
        moe_intermediate_size=48,
        num_experts=4,
        num_experts_per_tok=2,
        num_dense_layers=1,
        layer_types=["conv", "full_attention"],
    ),
    # Llama 4 (Scout's layout: every layer MoE): the router weight scales the experts' input, a shared
    # expert the config does not name; layer 0 chunked attention with rotary positions (4-token chunks:
    # the check prompts are longer), layer 1 full attention without positions (NoPE), as released
    "llama4_text": dict(
        intermediate_size=48,
        num_local_experts=4,
        num_experts_per_tok=2,
        head_dim=8,
        attention_chunk_size=4,
        layer_types=["chunked_attention", "full_attention"],
        no_rope_layers=[1, 0],
    ),
    "qwen2_moe": dict(
        moe_intermediate_size=48, shared_expert_intermediate_size=64, num_experts=4, num_experts_per_tok=2
    ),
    "qwen3_moe": dict(moe_intermediate_size=48, num_experts=4, num_experts_per_tok=2, head_dim=8),
    "olmoe": dict(intermediate_size=48, num_experts=4, num_experts_per_tok=2),
    "gpt_oss": dict(
        intermediate_size=48, num_local_experts=4, num_experts_per_tok=2, head_dim=8, sliding_window=4
    ),  # layer 0 sliding (with attention sinks), layer 1 full
    # from here on, the released layouts where a family has one: layer 0 a dense gated MLP (96 neurons,
    # padded onto the experts' axis), layer 1 MoE (first_k_dense_replace, moe_layer_start_index,
    # num_dense_layers, mlp_layer_types); GraniteMoE, FlexOlmo and MiniMax-M2 have no dense layers
    "granitemoe": dict(intermediate_size=48, num_local_experts=4, num_experts_per_tok=2),
    # JetMoE: experts as input_linear / output_linear ParallelExperts and an output bias; attention is a
    # mixture of query / output-projection experts (2 of 4 per token, 2 heads each, 8 wide)
    "jetmoe": dict(intermediate_size=48, num_local_experts=4, num_experts_per_tok=2, kv_channels=8),
    "flex_olmo": dict(intermediate_size=48, num_experts=4, num_experts_per_tok=2),
    # HunYuan-MoE (adapter: capinterp.arch.adapters): QK norm, a shared expert the config does not name
    "hunyuan_v1_moe": dict(intermediate_size=48, num_experts=4, moe_topk=2, head_dim=8),
    # PhiMoE (adapter: capinterp.arch.adapters): LayerNorms, attention and unembedding biases as released,
    # sparsemixer routing inside its router
    "phimoe": dict(
        intermediate_size=48, num_local_experts=4, num_experts_per_tok=2, attention_bias=True, lm_head_bias=True
    ),
    "minimax_m2": dict(intermediate_size=48, num_local_experts=4, num_experts_per_tok=2, head_dim=8),
    "ernie4_5_moe": dict(
        intermediate_size=96,
        moe_intermediate_size=48,
        moe_num_experts=4,
        moe_k=2,
        moe_num_shared_experts=1,
        moe_layer_start_index=1,
    ),
    "glm4_moe": dict(
        moe_intermediate_size=48,
        n_routed_experts=4,
        num_experts_per_tok=2,
        n_shared_experts=1,
        head_dim=8,
        intermediate_size=96,
        first_k_dense_replace=1,
        n_group=1,
        topk_group=1,
    ),
    "glm4_moe_lite": dict(
        moe_intermediate_size=48,
        n_routed_experts=4,
        num_experts_per_tok=2,
        n_shared_experts=1,
        n_group=1,
        topk_group=1,
        intermediate_size=96,
        mlp_layer_types=["dense", "sparse"],
        qk_rope_head_dim=4,
        qk_nope_head_dim=4,
        v_head_dim=8,
        kv_lora_rank=16,
        q_lora_rank=16,
    ),
    "afmoe": dict(
        moe_intermediate_size=48,
        num_experts=4,
        num_experts_per_tok=2,
        num_shared_experts=1,
        intermediate_size=96,
        num_dense_layers=1,
        head_dim=8,
        sliding_window=4,  # both layers sliding
    ),
    "deepseek_v2": {**_DEEPSEEK_MOE, **_MLA},
    "deepseek_v3": {**_DEEPSEEK_MOE, **_MLA},
    # Youtu-LLM: DeepSeek-V3's multi-head latent attention (interleaved rotary dimensions) in every layer,
    # each with a dense gated MLP
    "youtu": dict(_MLA, intermediate_size=96),
    # DeepSeek-V4: four residual streams (hyper-connections), compressed attention, layer 0 routed by a
    # token id -> experts table (hash routing, drawn by tiny_hf), layer 1 by its gate; SwiGLU clamped at 10
    # DeepSeek-V4: compressed sparse attention (a block of 4 keys compressed into one, an indexer picking
    # blocks) then heavily compressed attention (blocks of 8 here, 128 in the real model), so that prompts of
    # ten tokens compress in both layers
    "deepseek_v4": dict(
        moe_intermediate_size=48,
        num_local_experts=4,
        num_experts_per_tok=2,
        head_dim=8,
        mlp_layer_types=["hash_moe", "moe"],
        layer_types=["compressed_sparse_attention", "heavily_compressed_attention"],
        compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
    ),
    # dots.llm1 (adapter: capinterp.arch.adapters): Qwen3 attention, DeepSeek-V3 routing, a dense layer 0
    "dots1": dict(_DEEPSEEK_MOE, head_dim=8, sliding_window=4, layer_types=["sliding_attention", "full_attention"]),
    "laguna": dict(
        moe_intermediate_size=48,
        shared_expert_intermediate_size=64,
        num_experts=4,
        num_experts_per_tok=2,
        head_dim=8,
        intermediate_size=96,
        mlp_layer_types=["dense", "sparse"],
        layer_types=["sliding_attention", "full_attention"],  # all full by default, its window unused
        sliding_window=4,
    ),
    # Granite 4.0 (adapter: capinterp.arch.adapters): a Mamba-2 layer ("linear_attention" in its config's
    # vocabulary), then attention with rotary positions; experts plus a shared MLP the decoder layer adds
    # beside them (fused input_linear); Granite's four multipliers away from 1
    "granitemoehybrid": dict(
        intermediate_size=48,
        shared_intermediate_size=64,
        num_local_experts=4,
        num_experts_per_tok=2,
        layer_types=["linear_attention", "full_attention"],
        position_embedding_type="rope",
        mamba_n_heads=4,
        mamba_d_head=16,  # 4 x 16 = mamba_expand (2) x hidden_size
        mamba_d_state=8,
        **_GRANITE_MULTIPLIERS,
    ),
    # Granite 4.0 Micro's layout (GraniteMoeHybrid with attention layers only and no experts): the shared
    # MLP is the layer's FFN (the H-Micro layout, Mamba-2 layers without experts: tests/families/test_granite_hybrid.py)
    "granitemoehybrid_dense": dict(
        shared_intermediate_size=96,  # its intermediate_size (1024 by default) sizes no module
        num_local_experts=0,
        layer_types=["full_attention", "full_attention"],
        position_embedding_type="rope",
        **_GRANITE_MULTIPLIERS,
    ),
    # NemotronH (adapter and layer split: capinterp.arch.one_sublayer): each layer one sublayer, the four kinds
    # in the config's default order: Mamba-2 mixer, experts (plain ReLU-squared experts and shared expert,
    # DeepSeek-V3's sigmoid routing), attention without positions, a plain MLP narrower than the experts' axis
    "nemotron_h": _NEMOTRON_H_MOE,
    # Nemotron 3 Super's latent experts: the routed experts read a 16-wide projection of the residual
    # stream and write back through another (moe_latent_size; the router and the shared expert read it)
    "nemotron_h_latent": dict(_NEMOTRON_H_MOE, moe_latent_size=16),
    # the dense NemotronH layout (Nemotron-H 8B, Nemotron Nano 9B v2: Mamba-2, MLP and attention layers)
    "nemotron_h_dense": dict(
        layers_block_type=["linear_attention", "mlp", "full_attention", "mlp"],
        num_hidden_layers=4,
        **{**_NEMOTRON_H, "intermediate_size": 96},
    ),
}

# rows of TINY_FAMILIES that are a variant of a transformers family (their model_type), not a family of their own
TINY_VARIANT_OF: dict[str, str] = {
    "gemma4_text_moe": "gemma4_text",
    "granitemoehybrid_dense": "granitemoehybrid",
    "nemotron_h_dense": "nemotron_h",
    "nemotron_h_latent": "nemotron_h",
}


def model_type(family: str) -> str:
    """The transformers ``model_type`` of a row of ``TINY_FAMILIES`` (a variant's family)."""
    return TINY_VARIANT_OF.get(family, family)


# families whose biases tiny_hf draws too (std 0.1): transformers initializes them to 0, the released
# checkpoints have them, and a path that forgot one would pass with zeros (PhiMoE's attention,
# LayerNorm and unembedding biases; JetMoE's MoE and attention output biases)
TINY_DRAWN_BIASES: tuple[str, ...] = ("phimoe", "jetmoe")


# Families of the bridge capinterp refuses at load (the reason: tests/families/test_family_record.py,
# docs/models.md); tiny models of them test that the refusal names the family and the reason.
TINY_REFUSED: dict[str, dict[str, Any]] = {
    # HRM: two recurrent stacks of layers run in cycles; the bridge maps no blocks.{l}
    "hrm_text": dict(intermediate_size=96, num_hidden_layers=4, num_layers_per_stack=2, H_cycles=1, L_cycles=1),
}


# the MoE families of TINY_FAMILIES whose tiny model has a dense layer 0 (the released layout: dense
# layers first), padded onto the experts' neuron axis
TINY_MIXED: tuple[str, ...] = tuple(
    f
    for f, kw in TINY_FAMILIES.items()
    if kw.get("first_k_dense_replace")
    or kw.get("moe_layer_start_index")
    or kw.get("num_dense_layers")
    or kw.get("expert_layer_offset")
    or (kw.get("mlp_layer_types") or [""])[0] == "dense"
)

# the hybrid families of TINY_FAMILIES (linear-attention, Mamba or convolution layers beside softmax
# attention, capinterp.arch.family.SERVED_MIXERS): served, their methods that need attention in every layer
# refuse (capinterp.arch.family.require_attention); tests/families/test_hybrid.py checks this list
# against the configs' layer_types
TINY_HYBRID: tuple[str, ...] = (
    "qwen3_next",
    "qwen3_5_moe_text",
    "qwen3_5_text",
    "bamba",
    "olmo_hybrid",
    "jamba",
    "falcon_h1",
    "lfm2",
    "lfm2_moe",
    "granitemoehybrid",
    "nemotron_h",
    "nemotron_h_dense",
    "nemotron_h_latent",
)


def tiny_hf(family: str, *, seed: int = 0, std: float = 0.15, **overrides: Any) -> tuple[Any, Any]:
    """``(hf_model, tokenizer)``: a tiny random model of a transformers family (``TINY_FAMILIES``).

    Built from the family's own config class (``AutoConfig.for_model``) with 2 layers, d_model 32
    and the tiny tokenizer; 2-D weights (and MoE experts' 3-D stacks) drawn with ``std`` (as :func:`tiny_llama_hf`), so outputs
    depend on the neurons. ``overrides`` set further config fields.
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    known = {**TINY_FAMILIES, **TINY_REFUSED}
    if family not in known:
        raise ValueError(f"unknown tiny family {family!r}: one of {sorted(known)}")
    tok = tiny_tokenizer()
    cfg = AutoConfig.for_model(model_type(family))
    fields = dict(
        vocab_size=len(tok),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=256,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    if hasattr(cfg, "num_key_value_heads"):
        fields["num_key_value_heads"] = 2
    for key, value in {**fields, **known[family], **overrides}.items():
        setattr(cfg, key, value)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(cfg)
        for p in model.parameters():
            if p.dim() in (2, 3):  # matrices, and the stacked experts of MoE families
                torch.nn.init.normal_(p, std=std)
        for name, buf in model.named_buffers():
            if name.endswith("layer_scalar"):  # a per-layer scale of the residual (Gemma 4): 1 at init
                buf.uniform_(0.5, 1.5)
            if name.endswith("tid2eid"):  # DeepSeek-V4's token -> experts table (all expert 0 at init): distinct draws
                n_experts = int(cfg.num_local_experts)
                buf.copy_(torch.stack([torch.randperm(n_experts)[: buf.shape[1]] for _ in range(buf.shape[0])]))
        if family in TINY_DRAWN_BIASES:
            for name, p in model.named_parameters():
                if p.dim() == 1 and name.endswith("bias"):
                    torch.nn.init.normal_(p, std=0.1)
    cfg.architectures = [type(model).__name__]
    return model.eval(), tok
