"""One record per model of what capinterp's methods need to know about its architecture.

Every family-specific fact lives here, read once from the transformers config (or the
TransformerLens config of a native model) when the model loads: FFN width, whether attention
and MLP read the same residual (parallel blocks), gated or plain MLP, positional scheme,
the multipliers some families put on embeddings, residual branches, attention
scores and logits, the final logit soft-cap, and mixture-of-experts FFNs. Methods ask the
record (:func:`family_of`), never a family name; anything that rebuilds logits by hand goes
through :func:`logit_transform` (used by :func:`capinterp.arch.forward.unembed`).

The record is built in one step (:func:`read_family`) from everything it depends on: the configs,
and, at load, the neuron axis the layers give (:class:`NeuronAxis`, read by
:func:`capinterp.arch.experts.install`) and the first forward's final-norm order
(:mod:`capinterp.arch.embedding_norm`); nothing patches it afterwards.

A model the record cannot serve is refused at load (:func:`check_supported`) with a message
naming the family and what is missing, never partway through a run. As a last guard,
:func:`capinterp.arch.model.check_logit_path` compares capinterp's hand-built logits with the model's own forward at
load, so a family whose logits need a step this record does not know fails loudly there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from capinterp.core.protocol import Model

__all__ = [
    "FFN_ONLY_LAYERS",
    "Family",
    "MoE",
    "NeuronAxis",
    "UnsupportedFamily",
    "check_supported",
    "family_of",
    "layer_kinds",
    "logit_transform",
    "read_family",
    "require_attention",
    "width_mask",
]

# layer kinds besides softmax attention (transformers' layer_types) that a hybrid model may have and capinterp
# serves: "linear_attention" (Qwen3-Next's gated delta net; transformers also calls Mamba layers so: Bamba,
# Jamba, GraniteMoE-Hybrid), "conv" (LFM2's short convolution), "hybrid" (Falcon-H1: attention and Mamba side
# by side). Neuron methods run there (IG's fast route continues each row from a copy of the prefix's recurrent
# or convolution state, capinterp.kernels.prefix); methods that need attention in every layer refuse (require_attention)
SERVED_MIXERS = ("linear_attention", "conv", "hybrid", "mlp", "moe")

# layer kinds with an FFN and no mixer (NemotronH's "mlp" and "moe" layers: each of its layers is one
# sublayer): capinterp.arch.one_sublayer gives every layer of such a model a mixer slot and an FFN slot,
# the mixer layers an FFN with no neurons, so the neuron axis has one row per layer as everywhere else
FFN_ONLY_LAYERS = ("mlp", "moe")

# transformers config fields holding the FFN width, in the order families use them (Granite 4.0's FFN
# is its shared MLP, shared_intermediate_size wide; its intermediate_size is the experts', if any)
_FFN_WIDTH_FIELDS = (
    "shared_intermediate_size",
    "intermediate_size",
    "n_inner",
    "ffn_dim",
    "ffn_hidden_size",
    "d_ff",
    "ffn_hidden_dim",
)


class UnsupportedFamily(NotImplementedError):
    """The model's architecture needs something capinterp does not provide; raised at load."""


@dataclass(frozen=True)
class MoE:
    """A mixture-of-experts FFN: ``n_experts`` routed experts of ``d_expert`` neurons, ``top_k`` per
    token, and ``n_shared`` shared experts of ``d_shared`` neurons in all (:mod:`capinterp.arch.experts`)."""

    n_experts: int
    top_k: int
    d_expert: int
    n_shared: int = 0
    d_shared: int = 0

    @property
    def width(self) -> int:
        """Neurons per layer: the routed experts' (expert-major), then the shared experts'."""
        return self.n_experts * self.d_expert + self.d_shared

    def locate(self, neuron: int) -> tuple[int | None, int]:
        """``(expert, index in it)`` of flat neuron ``neuron``; expert ``None`` is the shared expert."""
        if not 0 <= neuron < self.width:
            raise ValueError(f"neuron {neuron} is outside this layer's {self.width} neurons")
        routed = self.n_experts * self.d_expert
        return (None, neuron - routed) if neuron >= routed else divmod(neuron, self.d_expert)


@dataclass(frozen=True)
class Family:
    """Architecture facts of one model (see the module docstring)."""

    name: str  # transformers model_type ("gpt2", "llama", ...); "native" for TransformerLens-native models
    architecture: str  # e.g. "GPT2LMHeadModel"
    n_layers: int
    d_model: int
    d_mlp: int  # FFN width: the neurons per layer (MoE: all experts' neurons, MoE.width)
    n_heads: int
    n_kv_heads: int
    d_head: int
    parallel_block: bool = False  # attention and MLP of a block read the same residual
    gated_mlp: bool = False
    positions: str = "rotary"  # TransformerLens positional_embedding_type: rotary, standard, alibi, ...
    conv1d: bool = False  # transformers Conv1D modules: weights stored [in, out]
    logit_multiplier: float = (
        1.0  # final logits = this * (ln_final(h) @ W_U); Cohere logit_scale, Granite 1/logits_scaling
    )
    logit_softcap: float | None = None  # Gemma 2/3: cap * tanh(logits / cap), applied after the multiplier
    embedding_multiplier: float = 1.0  # Granite
    residual_multiplier: float = 1.0  # Granite: every attention / MLP output is scaled before joining the residual
    ffn_multiplier: float = 1.0  # Falcon-H1: the FFN's output is this times its down projection's
    attn_in_multiplier: float = 1.0  # Falcon-H1: the attention reads its norm's output times this
    attn_out_multiplier: float = 1.0  # Falcon-H1: the attention's output times this joins the residual
    moe: MoE | None = None
    # a sliding attention window the attention module applies itself by absolute position in the
    # sequence it is given, not through the attention mask (GPT-Neo's "local" layers); IG's fast
    # route then puts its rows in the batch dimension instead of folding them into the sequence,
    # which such a window would cut (capinterp.kernels.prefix, docs/models.md)
    module_window: int | None = None
    # layer kinds other than softmax attention (config ``layer_types``: Qwen3-Next's "linear_attention",
    # LFM2's "conv", Mamba mixers): those not in SERVED_MIXERS are refused at load (check_supported)
    hybrid_layers: tuple[str, ...] = ()
    # the attention's heads are experts a router picks per token (JetMoE's mixture of attention heads:
    # query and output projections per expert, keys and values shared): head k of a token is its k-th
    # chosen expert's, so heads are no fixed units; methods over heads refuse (require_attention)
    routed_heads: bool = False
    # the final norm module also normalizes the embeddings before the first layer (NanoChat): found by
    # the first forward at load, which then routes that first call around ln_final's hooks
    # (capinterp.arch.embedding_norm), so ln_final.hook_in carries only the last residual
    embedding_norm: bool = False
    # each layer's own neurons where they differ between layers (dense layers between MoE layers:
    # DeepSeek's first_k_dense_replace); a layer's neurons are the first layer_widths[l] of the
    # d_mlp-wide axis, the rest is padding, always 0 (read at load by capinterp.arch.experts.install).
    # Empty when every layer has d_mlp neurons
    layer_widths: tuple[int, ...] = ()
    # the residual between layers is this many streams (DeepSeek-V4's hyper-connections, config hc_mult):
    # blocks.{l}.hook_out is [batch, pos, streams, d_model]; each sublayer reads a learned, input-dependent
    # mix of them and writes into all of them, and the model's hc_head collapses them before the final norm
    residual_streams: int = 1
    # AltUp's residual streams (Gemma 3n, config altup_num_inputs): blocks.{l}.hook_in / hook_out are
    # [streams, batch, pos, d_model], the streams axis first; each layer predicts every stream from all of
    # them, runs attention and the MLP on one (hook_resid_pre / hook_resid_post), and corrects all of them
    # with learned, input-dependent coefficients; the model projects and averages them before the final norm
    altup_streams: int = 1

    @property
    def neurons(self) -> tuple[int, int]:
        """``(n_layers, d_mlp)``: the shape of every neuron score / mask."""
        return self.n_layers, self.d_mlp

    def valid_neurons(self) -> torch.Tensor:
        """Bool ``[n_layers, d_mlp]``: True at the model's real neurons, False at padding (:func:`width_mask`)."""
        return width_mask(self.layer_widths, self.neurons)


@dataclass(frozen=True)
class NeuronAxis:
    """The neuron axis as a model's layers give it, where the modules say more than the config: the axis
    width ``d_mlp`` (Gemma 4's widest MLP), the experts ``moe`` (a shared expert the config does not name,
    Llama 4's) and each layer's own width where layers differ (``layer_widths``, :attr:`Family.layer_widths`).
    Read at load by :func:`capinterp.arch.experts.install`; :func:`read_family` takes it."""

    d_mlp: int
    moe: MoE | None = None
    layer_widths: tuple[int, ...] = ()


def width_mask(layer_widths: Any, shape: tuple[int, int]) -> torch.Tensor:
    """Bool ``[n_layers, d_mlp]``, True at real neurons: layer ``l``'s first ``layer_widths[l]``
    neurons; every neuron when ``layer_widths`` is empty or None. ValueError for widths that do not fit ``shape``."""
    n_layers, d_mlp = int(shape[0]), int(shape[1])
    if not layer_widths:
        return torch.ones(n_layers, d_mlp, dtype=torch.bool)
    widths = list(layer_widths)
    if (
        len(widths) != n_layers
        or not all(isinstance(w, int) and not isinstance(w, bool) and 0 <= w <= d_mlp for w in widths)
        or not any(widths)
    ):
        raise ValueError(
            f"layer_widths must be {n_layers} integers in [0, {d_mlp}], not all 0 (each layer's neurons; 0: a layer "
            f"whose FFN has none, NemotronH's mixer layers), got {widths!r:.200}"
        )
    return torch.arange(d_mlp)[None, :] < torch.tensor(widths)[:, None]


def family_of(model: Model) -> Family:
    """The model's :class:`Family`, read once and kept on the model (``model.capinterp_family``)."""
    fam = getattr(model, "capinterp_family", None)
    if isinstance(fam, Family):
        return fam
    fam = read_family(model)
    try:
        model.capinterp_family = fam
    except (AttributeError, TypeError):  # pragma: no cover - a model that refuses attributes
        pass
    return fam


def _hf_config(model: Model) -> Any:
    cfg = getattr(getattr(model, "original_model", None), "config", None)
    if cfg is None or not hasattr(cfg, "to_dict"):
        return None
    return cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg


def _get(cfg: Any, *names: str, default: Any = None) -> Any:
    for n in names:
        v = getattr(cfg, n, None)
        if v is not None:
            return v
    return default


def _moe(hf: Any, d_model: int) -> MoE | None:
    n = _get(hf, "num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")
    kinds = getattr(hf, "layers_block_type", None)  # NemotronH: experts only where a layer is "moe"
    if not n or int(n) <= 1 or (isinstance(kinds, (list, tuple)) and "mlp" in kinds and "moe" not in kinds):
        return None
    if getattr(hf, "enable_moe_block", None) is False:  # Gemma 4: experts configured, not built
        return None
    top_k = int(_get(hf, "num_experts_per_tok", "top_k", "moe_top_k", "moe_topk", "top_k_experts", default=1))
    d_expert = int(_get(hf, "moe_intermediate_size", "intermediate_size", "ffn_dim", default=4 * d_model))
    shared = _get(hf, "n_shared_experts", "num_shared_experts", "moe_num_shared_experts", default=None)
    d_shared = _get(
        hf, "shared_expert_intermediate_size", "shared_intermediate_size", "moe_shared_expert_intermediate_size"
    )
    if shared is None:
        shared = 1 if d_shared else 0
    if d_shared is None:
        d_shared = int(shared) * d_expert
    return MoE(n_experts=int(n), top_k=top_k, d_expert=d_expert, n_shared=int(shared), d_shared=int(d_shared))


def _hybrid_layers(hf: Any) -> tuple[str, ...]:
    kinds = getattr(hf, "layer_types", None)
    if not isinstance(kinds, (list, tuple)):
        return ()
    found = {str(k) for k in kinds if k == "linear_attention" or "attention" not in str(k)}
    if "hybrid" in found and getattr(hf, "num_mem_blocks", None):  # Zamba's: a transformer block shared by layers
        found = (found - {"hybrid"}) | {"shared_block"}
    return tuple(sorted(found))


# why a layer kind capinterp does not serve cannot be served, where more is known than "another mixer"
_UNSERVED_WHY = {"shared_block": "layers that call one transformer block whose weights several layers share (Zamba)"}


def _ffn_width(hf: Any, d_model: int) -> int:
    width = _get(hf, *_FFN_WIDTH_FIELDS)  # absent: 4 * d_model (BLOOM; MPT, whose MLP ignores expansion_ratio)
    if isinstance(width, (list, tuple)):  # Gemma 3n: one width per layer
        if len(set(width)) != 1:
            name = getattr(hf, "model_type", "this model")
            raise UnsupportedFamily(f"{name}: FFN widths differ across layers ({sorted(set(width))}); one neuron axis")
        width = width[0]
    width = int(width) if width is not None else 4 * d_model
    if getattr(hf, "block_auto_adjust_ff_dim", False):  # LFM2: 2/3 of the config's width (a gated MLP's
        width = int(2 * width / 3)  # usual budget), times a multiplier, rounded up to a multiple
        multiplier = getattr(hf, "block_ffn_dim_multiplier", None)
        if multiplier is not None:
            step = int(hf.block_multiple_of)
            width = step * -(-int(multiplier * width) // step)
    return width


def _module_window(hf: Any) -> int | None:
    layers = getattr(hf, "attention_layers", None)  # GPT-Neo: per-layer "global" / "local"
    if isinstance(layers, (list, tuple)) and "local" in layers and getattr(hf, "window_size", None):
        return int(hf.window_size)
    return None


def _first_attention(model: Model) -> list[torch.nn.Module]:
    """The transformers modules of the first block's attention (none where the bridge has no attention there)."""
    attn = getattr(getattr(model.blocks[0], "attn", None), "original_component", None)
    return list(attn.modules()) if isinstance(attn, torch.nn.Module) else []


def _routed_heads(model: Model) -> bool:
    """Whether the first attention holds a router (a mixture of attention heads, JetMoE's), read from the modules."""
    return any(getattr(m, "router", None) is not None for m in _first_attention(model))


def read_family(model: Model, axis: NeuronAxis | None = None, embedding_norm: bool = False) -> Family:
    """Build the :class:`Family` of a ``TransformerBridge`` in one step from its configs (no forward pass)
    and what the load found beyond them: the neuron axis its layers give (``axis``, from
    :func:`capinterp.arch.experts.install`; None: the config's) and whether its final norm also normalizes the
    embeddings (``embedding_norm``, from the first forward, :func:`capinterp.arch.embedding_norm.final_norm_order`)."""
    tl = model.cfg
    common: dict[str, Any] = dict(
        n_layers=int(tl.n_layers),
        d_model=int(tl.d_model),
        n_heads=int(tl.n_heads),
        n_kv_heads=int(getattr(tl, "n_key_value_heads", None) or tl.n_heads),
        d_head=int(tl.d_head),
        parallel_block=bool(getattr(tl, "parallel_attn_mlp", False)),
        gated_mlp=bool(getattr(tl, "gated_mlp", False)),
        positions=str(getattr(tl, "positional_embedding_type", "standard")),
    )
    hf = _hf_config(model)
    if hf is None:  # TransformerLens-native model: its own config is the whole truth
        return Family(
            name="native",
            architecture=str(getattr(tl, "architecture", None) or "native"),
            d_mlp=axis.d_mlp if axis else int(tl.d_mlp),
            layer_widths=axis.layer_widths if axis else (),
            embedding_norm=embedding_norm,
            **common,
        )
    name = str(getattr(hf, "model_type", "") or type(model.original_model).__name__)
    if not hasattr(model, "blocks"):  # HRM: its layers run as recurrent stacks, mapped as no blocks.{l}
        raise UnsupportedFamily(
            f"{name} ({type(model.original_model).__name__}): the TransformerBridge maps no per-layer blocks "
            "(blocks.{l}) for this model; capinterp's neurons are blocks.{l}.mlp.hook_post"
        )
    moe = axis.moe if axis else _moe(hf, common["d_model"])
    logit_multiplier = float(_get(hf, "logit_scale", default=1.0)) * float(_get(hf, "lm_head_multiplier", default=1.0))
    scaling = _get(hf, "logits_scaling")
    if scaling is not None:
        logit_multiplier /= float(scaling)
    arch = (getattr(hf, "architectures", None) or [type(model.original_model).__name__])[0]
    from capinterp.arch.linear import is_conv1d

    return Family(
        name=name,
        architecture=str(arch),
        d_mlp=axis.d_mlp if axis else moe.width if moe else _ffn_width(hf, common["d_model"]),
        conv1d=any(is_conv1d(m) for m in model.original_model.modules()),
        logit_multiplier=logit_multiplier,
        logit_softcap=_get(hf, "final_logit_softcapping"),
        embedding_multiplier=float(_get(hf, "embedding_multiplier", default=1.0)),
        residual_multiplier=float(_get(hf, "residual_multiplier", default=1.0)),
        ffn_multiplier=float((_get(hf, "mlp_multipliers") or [1.0, 1.0])[1]),  # Falcon-H1: [gate, down]
        attn_in_multiplier=float(_get(hf, "attention_in_multiplier", default=1.0)),
        attn_out_multiplier=float(_get(hf, "attention_out_multiplier", default=1.0)),
        moe=moe,
        layer_widths=axis.layer_widths if axis else (),
        embedding_norm=embedding_norm,
        module_window=_module_window(hf),
        hybrid_layers=_hybrid_layers(hf),
        routed_heads=_routed_heads(model),
        # several residual streams where the bridge maps the model's collapse of them (DeepSeek-V4's hc_head)
        residual_streams=int(_get(hf, "hc_mult", default=1)) if hasattr(model, "hc_head") else 1,
        altup_streams=int(_get(hf, "altup_num_inputs", default=1)),
        **common,
    )


def check_supported(fam: Family) -> None:
    """Refuse, naming the family and what is missing, a model capinterp cannot serve correctly.

    Mixture-of-experts models pass here; their modules are checked when
    :func:`capinterp.arch.experts.install` serves them at load.
    """
    if other := [k for k in fam.hybrid_layers if k not in SERVED_MIXERS]:
        why = sorted({_UNSERVED_WHY[k] for k in other if k in _UNSERVED_WHY})
        raise UnsupportedFamily(
            f"{fam.name} ({fam.architecture}): its layers include {other} besides softmax attention "
            f"(a hybrid model{': ' + '; '.join(why) if why else ''}); capinterp serves only "
            f"{list(SERVED_MIXERS)} layers beside attention"
        )
    if fam.moe is not None and fam.moe.n_experts * fam.moe.d_expert <= 0:
        raise UnsupportedFamily(f"{fam.name} ({fam.architecture}): its config gives experts no neurons ({fam.moe})")


def layer_kinds(fam: Family) -> str:
    """A hybrid model's layer kinds besides softmax attention, in words (for messages): its mixers, and
    its layers that are an FFN alone (NemotronH's), which have no attention either."""
    mixers = [k for k in fam.hybrid_layers if k not in FFN_ONLY_LAYERS]
    ffn = [k for k in fam.hybrid_layers if k in FFN_ONLY_LAYERS]
    parts = ([f"{mixers} mixers"] if mixers else []) + ([f"layers that are an FFN alone ({ffn})"] if ffn else [])
    return " and ".join(parts)


def require_attention(fam: Family, what: str, heads: bool = True) -> None:
    """Refuse ``what`` (a method that reads softmax attention, per-head outputs or a key/value cache in
    every layer: knowledge circuits, head patching, attention tracing) on a hybrid model; where it
    takes attention heads as units (``heads``), also on a model whose heads are routed per token."""
    if fam.hybrid_layers:
        raise UnsupportedFamily(
            f"{fam.name} ({fam.architecture}): {what} needs softmax attention in every layer, and this hybrid "
            f"model's layers include {layer_kinds(fam)}; its neuron methods run, this one cannot"
        )
    if heads:
        require_fixed_heads(fam, what)


def require_fixed_heads(fam: Family, what: str) -> None:
    """Refuse ``what`` (a method taking attention heads as units: knowledge circuits, head patching) on a
    model whose heads are routed per token (JetMoE)."""
    if fam.routed_heads:
        raise UnsupportedFamily(
            f"{fam.name} ({fam.architecture}): {what} takes attention heads as units, and this model's heads are "
            "experts its router picks per token (a mixture of attention heads: head k of a token is its k-th "
            "chosen expert's query and output projection), so a head is no fixed unit; its neuron methods run, "
            "this one cannot"
        )


def logit_transform(fam: Family, logits: torch.Tensor) -> torch.Tensor:
    """Apply the family's own final steps to ``ln_final(h) @ W_U``: multiplier, then soft-cap."""
    if fam.logit_multiplier != 1.0:
        logits = logits * fam.logit_multiplier
    if fam.logit_softcap:
        logits = torch.tanh(logits / fam.logit_softcap) * fam.logit_softcap
    return logits
