"""Token-level HTML views (circuitsvis): what located neurons and attention heads do on one prompt.

:func:`neuron_activations_view` shows each located FFN neuron's activation (``blocks.{l}.mlp.hook_post``)
on every token of a prompt, the view of Dai et al. (2022, "Knowledge Neurons", section 4), where a
knowledge neuron fires on the prompts that express its fact. :func:`attention_view` shows one layer's
attention pattern (``blocks.{l}.attn.hook_pattern``), the pattern behind Query Localization's knowledge
synapses (Chen et al., ICLR 2025, "Query Localization"). Both return circuitsvis ``RenderedHTML`` (displays itself
in a notebook; ``str()`` gives standalone HTML). The prompt is tokenized as capinterp does everywhere
(the model's own BOS convention, no other special tokens). Neurons are read by iteration as
``(layer, index)`` pairs, so a ``NeuronSet`` or a plain list both work.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from circuitsvis.activations import text_neuron_activations
from circuitsvis.attention import attention_patterns
from circuitsvis.utils.render import RenderedHTML
from einops import rearrange
from jaxtyping import Float
from torch import Tensor

from capinterp.arch.family import UnsupportedFamily, family_of, layer_kinds
from capinterp.arch.model import valid_neurons
from capinterp.core.protocol import Model
from capinterp.core.tokens import model_bos

__all__ = ["attention_pattern", "attention_view", "neuron_activations", "neuron_activations_view", "prompt_tokens"]


def prompt_tokens(model: Model, prompt: str) -> tuple[Tensor, list[str]]:
    """Token ids ``[1, T]`` of ``prompt`` (the model's BOS convention) and their ``T`` decoded strings."""
    if not isinstance(prompt, str) or not prompt:
        raise ValueError(f"prompt must be a non-empty string, got {prompt!r}")
    tok = model.tokenizer
    ids = model_bos(model) + list(tok(prompt, add_special_tokens=False)["input_ids"])
    return torch.tensor([ids], device=model.cfg.device), [tok.decode([i]) for i in ids]


def _neuron_list(model: Model, neurons: Iterable) -> list[tuple[int, int]]:
    n_layers, d_mlp = int(model.cfg.n_layers), int(model.cfg.d_mlp)
    valid = valid_neurons(model)  # padding past a narrower layer's own width is no neuron
    out = []
    for key in neurons:
        if not (isinstance(key, Sequence) and len(key) == 2):
            raise TypeError(f"neurons must hold (layer, index) pairs, got {key!r}")
        layer, idx = int(key[0]), int(key[1])
        if not (0 <= layer < n_layers and 0 <= idx < d_mlp):
            raise ValueError(f"neuron {key!r} out of range: layer in [0, {n_layers}), index in [0, {d_mlp})")
        if not bool(valid[layer, idx]):
            raise ValueError(f"neuron {key!r} is padding: layer {layer} has {int(valid[layer].sum())} neurons")
        out.append((layer, idx))
    if not out:
        raise ValueError("neurons is empty: pass at least one (layer, index) pair")
    return out


@torch.no_grad()
def neuron_activations(model: Model, prompt: str, neurons: Iterable) -> tuple[list[str], Float[Tensor, "T K"]]:
    """The prompt's ``T`` tokens and the ``K`` given neurons' ``hook_post`` activations on each (float32, CPU)."""
    keys = _neuron_list(model, neurons)
    ids, strs = prompt_tokens(model, prompt)
    layers = sorted({layer for layer, _ in keys})
    names = {f"blocks.{layer}.mlp.hook_post" for layer in layers}
    _, cache = model.run_with_cache(ids, names_filter=lambda n: n in names)
    acts = torch.stack([cache[f"blocks.{layer}.mlp.hook_post"][0, :, idx] for layer, idx in keys], dim=-1)
    return strs, acts.float().cpu()


def neuron_activations_view(model: Model, prompt: str, neurons: Iterable) -> RenderedHTML:
    """circuitsvis view of each located neuron's activation on each token of ``prompt``.

    One selectable entry per neuron, labelled ``L{layer} N{index}``; the tokens are coloured by its
    ``hook_post`` activation ``[T]`` (see :func:`neuron_activations`).
    """
    keys = _neuron_list(model, neurons)
    strs, acts = neuron_activations(model, prompt, keys)
    return text_neuron_activations(
        tokens=strs,
        activations=rearrange(acts, "t k -> t 1 k"),
        first_dimension_name="Set",
        second_dimension_name="Neuron",
        first_dimension_labels=["located"],
        second_dimension_labels=[f"L{layer} N{idx}" for layer, idx in keys],
    )


@torch.no_grad()
def attention_pattern(
    model: Model, prompt: str, layer: int, heads: Sequence[int] | None = None
) -> tuple[list[str], Float[Tensor, "H T T"]]:
    """The prompt's ``T`` tokens and layer ``layer``'s attention pattern ``[H, query, key]`` (float32, CPU)."""
    n_layers, n_heads = int(model.cfg.n_layers), int(model.cfg.n_heads)
    if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < n_layers:
        raise ValueError(f"layer must be an int in [0, {n_layers}), got {layer!r}")
    chosen = list(range(n_heads)) if heads is None else [int(h) for h in heads]
    if not chosen or any(not 0 <= h < n_heads for h in chosen):
        raise ValueError(f"heads must be a non-empty list of ints in [0, {n_heads}) or None, got {heads!r}")
    name = f"blocks.{layer}.attn.hook_pattern"
    if name not in model.hook_dict:  # a hybrid model's linear-attention layer
        fam = family_of(model)
        raise UnsupportedFamily(
            f"{fam.name} ({fam.architecture}): layer {layer} has no softmax attention pattern (the model's layers "
            f"include {layer_kinds(fam)}); pick a layer with attention"
        )
    ids, strs = prompt_tokens(model, prompt)
    _, cache = model.run_with_cache(ids, names_filter=lambda n: n == name)
    return strs, cache[name][0, chosen].float().cpu()


def attention_view(model: Model, prompt: str, layer: int, heads: Sequence[int] | None = None) -> RenderedHTML:
    """circuitsvis view of layer ``layer``'s attention pattern on ``prompt`` (all heads, or ``heads``)."""
    strs, pattern = attention_pattern(model, prompt, layer, heads)
    return attention_patterns(tokens=strs, attention=pattern)
