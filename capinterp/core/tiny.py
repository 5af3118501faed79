"""Tiny random models for tests and examples: no network, built in a fraction of a second.

``tiny_llama`` is Llama-shaped (RMSNorm, rotary, gated SiLU MLP, grouped-query attention),
like SmolLM2, so every code path that runs on the packaged models runs on it too.
``tiny_native`` is TransformerLens' own native model (GPT-2-like, ungated GELU MLP).

The tokenizer is a byte-level BPE trained in memory on a fixed corpus (arithmetic and a few
facts) with digits split individually, as the packaged models do. Training is deterministic,
so every process builds the same vocabulary.
"""

from __future__ import annotations

import functools
import tempfile
from typing import Any

import torch

__all__ = ["tiny_llama_hf", "tiny_native_config", "tiny_tokenizer"]

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
