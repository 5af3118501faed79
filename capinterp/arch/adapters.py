"""TransformerBridge architecture adapters for transformers classes TransformerLens 4 has none for.

TransformerBridge picks an adapter by the transformers class name (``architectures[0]``); a class
it does not list is refused before capinterp sees the model. Where such a family is built from
parts the bridge already wraps, capinterp registers an adapter for it here, through the bridge's
own ``ArchitectureAdapterFactory.register_adapter`` (and the class-name list the bridge's loader
consults), once, before the first load. Each adapter says which module plays which part; the
forward stays transformers' own, and the family matrix checks every method on it against plain
transformers like any other family.

* ``PhimoeForCausalLM`` (PhiMoE): Mixtral's layout (rotary attention with separate q/k/v/o
  projections, a sparse MoE block ``mlp`` with a ``router``) with LayerNorm (weight and bias)
  instead of RMSNorm, optional attention and unembedding biases; its router's sparsemixer picks
  experts inside the router module, which capinterp's expert forward calls as it is.
* ``HunYuanMoEV1ForCausalLM`` (HunYuan-MoE): the bridge's HunYuan dense adapter with the FFN a sparse
  MoE block (router ``gate``, a float32 linear; a shared expert ``shared_mlp`` the config does not
  name, taken from the modules as Llama 4's).
* ``Dots1ForCausalLM`` (dots.llm1): Qwen3-MoE's module names (QK norm; a router ``gate``, here
  DeepSeek-V3's grouped sigmoid routing with a score bias, inside the router module; dense first
  layers, ``first_k_dense_replace``), so the bridge's own Qwen3-MoE adapter, which maps dense
  fallback layers too.

One family the bridge serves gets a capinterp adapter for the length of capinterp's own load (the
bridge's stays registered for everyone else):

* ``GraniteMoeHybridForCausalLM`` (Granite 4.0): the bridge maps its FFN as two modules, ``moe``
  (the sparse experts) and ``shared_mlp`` (a gated MLP with fused ``input_linear`` [gate | up] and
  ``output_linear``), summed inside the decoder layer, so no ``mlp`` and no ``hook_mlp_out``.
  capinterp's adapter is the bridge's with one FFN per layer named ``mlp``: the shared MLP where
  the model has no experts (Granite 4.0 Micro: a dense model), the sparse MoE block where it has
  (capinterp's expert forward then computes experts and shared MLP as one layer, see
  :mod:`capinterp.arch.experts`); ``hook_mlp_out`` fires on the layer's scaled contribution.
* ``NemotronHForCausalLM`` (NemotronH): the bridge maps each layer, one sublayer each, as one opaque
  ``mixer``. capinterp first renames each layer's modules by kind (:mod:`capinterp.arch.one_sublayer`,
  :data:`PREPARED_ARCHITECTURES`) and maps them as a hybrid's block: optional ``ln1`` / ``attn`` /
  ``mixer`` (Mamba-2) / ``ln2``, and an ``mlp`` in every layer (one with no neurons on mixer layers).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

__all__ = ["EXTRA_ARCHITECTURES", "PREPARED_ARCHITECTURES", "REMAPPED_ARCHITECTURES", "register", "remapped"]


def _phimoe_adapter() -> type:
    from transformer_lens.model_bridge.architecture_adapter import ArchitectureAdapter
    from transformer_lens.model_bridge.generalized_components import (
        BlockBridge,
        EmbeddingBridge,
        LinearBridge,
        MoEBridge,
        MoERouterBridge,
        NormalizationBridge,
        PositionEmbeddingsAttentionBridge,
        RotaryEmbeddingBridge,
        UnembeddingBridge,
    )

    class PhimoeAdapter(ArchitectureAdapter):
        """PhiMoE: pre-norm LayerNorm blocks, rotary attention, a sparse MoE FFN with a router."""

        def __init__(self, cfg: Any) -> None:
            super().__init__(cfg)
            for key, value in dict(
                normalization_type="LN",
                positional_embedding_type="rotary",
                final_rms=False,
                gated_mlp=True,
                attn_only=False,
                uses_rms_norm=False,
            ).items():
                setattr(self.cfg, key, value)
            self.weight_processing_conversions = {**self._qkvo_weight_conversions()}

            def norm(name: str) -> Any:
                return NormalizationBridge(name=name, config=self.cfg, use_native_layernorm_autograd=True)

            attn = PositionEmbeddingsAttentionBridge(
                name="self_attn",
                config=self.cfg,
                submodules={p: LinearBridge(name=f"{p}_proj") for p in ("q", "k", "v", "o")},
                requires_attention_mask=True,
                requires_position_embeddings=True,
            )
            mlp = MoEBridge(name="mlp", config=self.cfg, submodules={"gate": MoERouterBridge(name="router")})
            self.component_mapping = {
                "embed": EmbeddingBridge(name="model.embed_tokens"),
                "rotary_emb": RotaryEmbeddingBridge(name="model.rotary_emb", config=self.cfg),
                "blocks": BlockBridge(
                    name="model.layers",
                    submodules={
                        "ln1": norm("input_layernorm"),
                        "ln2": norm("post_attention_layernorm"),
                        "attn": attn,
                        "mlp": mlp,
                    },
                ),
                "ln_final": norm("model.norm"),
                "unembed": UnembeddingBridge(name="lm_head", config=self.cfg),
            }

    return PhimoeAdapter


def _hunyuan_moe_adapter() -> type:
    from transformer_lens.model_bridge.generalized_components import MoEBridge, MoERouterBridge
    from transformer_lens.model_bridge.supported_architectures.hunyuan_v1_dense import (
        HunYuanDenseV1ArchitectureAdapter,
    )

    class HunYuanMoEAdapter(HunYuanDenseV1ArchitectureAdapter):
        """HunYuan-MoE: HunYuan dense's blocks (QK norm after rotary) with a sparse MoE FFN whose
        router is ``gate`` (its shared expert ``shared_mlp`` runs inside the block)."""

        def __init__(self, cfg: Any) -> None:
            super().__init__(cfg)
            blocks: Any = self.component_mapping["blocks"]  # type: ignore[index]  # set by the dense adapter
            blocks.submodules["mlp"] = MoEBridge(
                name="mlp", config=self.cfg, submodules={"gate": MoERouterBridge(name="gate")}
            )

    return HunYuanMoEAdapter


def _dots1_adapter() -> type:
    from transformer_lens.model_bridge.supported_architectures.qwen3_moe import Qwen3MoeArchitectureAdapter

    return Qwen3MoeArchitectureAdapter  # Qwen3-MoE's modules exactly, dense first layers included


def _granite_hybrid_adapter() -> type:
    from transformer_lens.model_bridge.generalized_components import ScaledResidualBlockBridge
    from transformer_lens.model_bridge.supported_architectures.granite_moe_hybrid import (
        GraniteMoeHybridArchitectureAdapter,
    )

    class GraniteHybridOneFFN(GraniteMoeHybridArchitectureAdapter):
        """Granite 4.0 (Mamba-2 and attention layers): the bridge's modules, the FFN as one ``mlp``."""

        def _build_component_mapping(self) -> dict:
            mapping = super()._build_component_mapping()
            subs = dict(mapping["blocks"].submodules)
            shared, moe = subs.pop("shared_mlp"), subs.pop("moe", None)
            subs["mlp"] = moe if moe is not None else shared  # experts: the shared MLP joins their forward
            mapping["blocks"] = ScaledResidualBlockBridge(
                name="model.layers",
                submodules=subs,
                residual_contribution_scale=getattr(self.cfg, "residual_multiplier", 1.0),
                scaled_mlp_submodule="mlp",
            )
            return mapping

    return GraniteHybridOneFFN


def _gemma3n_text_adapter() -> type:
    from transformer_lens.model_bridge.supported_architectures.gemma3n import Gemma3nArchitectureAdapter

    class Gemma3nText(Gemma3nArchitectureAdapter):
        """Gemma 3n's text model alone (``Gemma3nForCausalLM``): the bridge's adapter for the multimodal
        model's text path, at the text model's module paths (no vision or audio tower, so no timm)."""

        required_libraries = []  # noqa: RUF012 (the base class declares it so)

        def __init__(self, cfg: Any) -> None:
            super().__init__(cfg)
            mapping: dict[str, Any] = dict(self.component_mapping or {})
            for part in ("embed", "rotary_emb", "blocks", "ln_final"):
                mapping[part].name = str(mapping[part].name).replace("model.language_model.", "model.")
            subs = mapping["blocks"].submodules
            subs["attn"] = subs.pop("self_attn")  # the canonical key: blocks.{l}.attn.*
            self.component_mapping = mapping

    return Gemma3nText


#: transformers class name -> the factory of capinterp's adapter for it
EXTRA_ARCHITECTURES = {
    "Gemma3nForCausalLM": _gemma3n_text_adapter,
    "PhimoeForCausalLM": _phimoe_adapter,
    "HunYuanMoEV1ForCausalLM": _hunyuan_moe_adapter,
    "Dots1ForCausalLM": _dots1_adapter,
}


def register() -> None:
    """Register capinterp's adapters with TransformerBridge (idempotent: a class already listed, by the
    bridge itself or by an earlier call, keeps the adapter it has)."""
    from transformer_lens.factories import architecture_adapter_factory as factory

    for name, make in EXTRA_ARCHITECTURES.items():
        if name in factory.SUPPORTED_ARCHITECTURES:  # registered before, or a later TransformerLens serves it
            continue
        adapter: Any = make()
        factory.SUPPORTED_ARCHITECTURES[name] = adapter  # the list the bridge's loader checks names against
        factory.ArchitectureAdapterFactory.register_adapter(name, adapter)


def _nemotron_h_adapter() -> type:
    from transformer_lens.model_bridge.generalized_components import (
        AttentionBridge,
        BlockBridge,
        DepthwiseConv1DBridge,
        GatedRMSNormBridge,
        LinearBridge,
        MoEBridge,
        RMSNormalizationBridge,
        SSM2MixerBridge,
    )
    from transformer_lens.model_bridge.supported_architectures.nemotron_h import NemotronHArchitectureAdapter

    class NemotronHSplit(NemotronHArchitectureAdapter):
        """NemotronH after :func:`capinterp.arch.one_sublayer.split`: pre-norm blocks whose mixer (attention
        without positions, or Mamba-2) and FFN (an MLP, experts, or one with no neurons) are optional by layer."""

        def __init__(self, cfg: Any) -> None:
            super().__init__(cfg)

            def norm(name: str) -> Any:
                bridge = RMSNormalizationBridge(name=name, config=self.cfg)
                bridge.optional = True  # the bridge's norm does not take optional=: set as its own adapter does
                return bridge

            inner_norm = GatedRMSNormBridge(name="norm")
            attn = AttentionBridge(
                name="self_attn",
                config=self.cfg,
                optional=True,
                maintain_native_attention=True,
                requires_attention_mask=True,
                requires_position_embeddings=False,
                submodules={p: LinearBridge(name=f"{p}_proj") for p in ("q", "k", "v", "o")},
            )
            mamba = SSM2MixerBridge(
                name="mamba",
                config=self.cfg,
                optional=True,
                submodules={
                    "in_proj": LinearBridge(name="in_proj"),
                    "conv1d": DepthwiseConv1DBridge(name="conv1d"),
                    "inner_norm": inner_norm,
                    "out_proj": LinearBridge(name="out_proj"),
                },
            )
            blocks = BlockBridge(
                name="model.layers",
                submodules={
                    "ln1": norm("input_layernorm"),
                    "attn": attn,
                    "mixer": mamba,
                    "ln2": norm("pre_ff_layernorm"),
                    "mlp": MoEBridge(name="mlp", config=self.cfg, submodules={}),  # capinterp serves every layer's
                },
            )
            self.component_mapping = {**(self.component_mapping or {}), "blocks": blocks}

    return NemotronHSplit


def _split_nemotron_h(hf_model: Any) -> None:
    from capinterp.arch.one_sublayer import split

    split(hf_model)


#: transformers class name -> capinterp's adapter used instead of the bridge's while capinterp loads it
REMAPPED_ARCHITECTURES = {
    "GraniteMoeHybridForCausalLM": _granite_hybrid_adapter,
    "NemotronHForCausalLM": _nemotron_h_adapter,
}

#: transformers class name -> what capinterp does to the transformers model before its adapter wraps it
PREPARED_ARCHITECTURES = {"NemotronHForCausalLM": _split_nemotron_h}


@contextlib.contextmanager
def remapped(architecture: str | None, hf_model: Any = None) -> Iterator[None]:
    """Within the block, the bridge builds ``architecture`` with capinterp's adapter where
    :data:`REMAPPED_ARCHITECTURES` has one (``hf_model`` first prepared for it, where
    :data:`PREPARED_ARCHITECTURES` says how); the bridge's own is registered again on exit."""
    from transformer_lens.factories import architecture_adapter_factory as factory

    make = REMAPPED_ARCHITECTURES.get(architecture or "")
    if make is None or architecture is None:
        yield
        return
    if hf_model is not None and architecture in PREPARED_ARCHITECTURES:
        PREPARED_ARCHITECTURES[architecture](hf_model)
    table: dict[str, Any] = factory.ArchitectureAdapterFactory._adapters
    before = table.get(architecture)
    table[architecture] = make()
    try:
        yield
    finally:
        if before is None:
            table.pop(architecture, None)
        else:
            table[architecture] = before
