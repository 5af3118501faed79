"""Dense FFN layers on a padded neuron axis (:class:`DenseBlock`), for :mod:`capinterp.arch.experts`.

A model whose layers differ in width puts every layer's neurons on one axis, as wide as the widest
layer: the dense layers among a mixture-of-experts model's expert layers (DeepSeek-V2/V3, GLM-4 MoE,
Ernie 4.5 MoE, AFMoE, Laguna: dense layers first; Llama 4 Maverick's interleaving), and NemotronH's
layers, whose mixer layers have an FFN with no neurons (:mod:`capinterp.arch.one_sublayer`). A
layer's real neurons come first, then padding that is always 0 and is no neuron of the model
(``Family.layer_widths``, ``Family.valid_neurons``). Refused at load, with the reason: a dense layer
wider than the axis, one that is not an MLP (gate_proj where gated, up_proj, down_proj, act_fn;
NemotronH's are plain, ReLU-squared), and one whose transformers forward differs from that MLP on
random inputs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from capinterp.arch.family import MoE, UnsupportedFamily, family_of
from capinterp.arch.gated_mlp import input_projections, is_mlp, mlp_neurons, module_of, named_gated, unwrap
from capinterp.core.protocol import Model

__all__ = ["DenseBlock", "dense_block"]


@dataclass(frozen=True, eq=False)
class DenseBlock:
    """A dense FFN layer of a model whose other layers are MoE (DeepSeek's first_k_dense_replace), or
    whose layers differ in width (NemotronH's mixer layers, whose FFN has no neurons): its ``width``
    neurons on the model's ``padded``-wide neuron axis, the rest of the axis always 0.

    The padding neurons exist only so every layer shares one axis: they are not neurons of the
    model. They have no weights (their value vectors and weight rows read as 0, and writing
    anything but 0 into them is a ValueError); random draws, selection statistics and chance
    levels skip them (:meth:`capinterp.arch.family.Family.valid_neurons`)."""

    layer: int
    block: Any  # transformers MLP: gated (gate_proj, up_proj, down_proj, act_fn) or plain (no gate_proj)
    width: int
    padded: int

    def forward(self, hook: torch.nn.Module, hidden_states: Tensor) -> Tensor:
        b = self.block
        a = mlp_neurons(b, hidden_states)
        neurons = hook(torch.nn.functional.pad(a, (0, self.padded - self.width)))
        return b.down_proj(neurons[..., : self.width])

    def _weight(self, name: str) -> Tensor:
        return unwrap(getattr(self.block, name)).weight

    def _pad(self, rows: Tensor) -> Tensor:
        return torch.cat([rows, rows.new_zeros(self.padded - self.width, rows.shape[1])])

    def values(self) -> Tensor:
        """``[padded, d_model]`` value vectors: the real neurons' down-projection columns, then zero rows."""
        return self._pad(self._weight("down_proj").T)

    def neuron_rows(self) -> Tensor:
        """``[padded, 3 * d_model]``: each real neuron's gate row, up row and value vector (a copy),
        then zero rows for the padding (``[padded, 2 * d_model]``, up row and value, in a plain MLP)."""
        w = [self._weight(attr) for _, attr in input_projections(self.block)] + [self._weight("down_proj").T]
        return self._pad(torch.cat([x.to(w[0].dtype) for x in w], dim=1))

    def _refuse_padding(self, rows: Tensor, what: str) -> None:
        if rows.numel() and bool(rows.ne(0).any()):
            raise ValueError(
                f"layer {self.layer} is a dense layer with {self.width} neurons on the experts' {self.padded}-wide "
                f"axis: neurons {self.width}..{self.padded - 1} are padding, not neurons of the model, and have no "
                f"weights; {what} gives them a non-zero value vector"
            )

    @torch.no_grad()
    def write_values(self, values: Tensor) -> None:
        """Replace every value vector by the rows of ``values`` (``[padded, d_model]``; padding rows must be 0)."""
        if values.shape[0] != self.padded:
            raise ValueError(f"values must have {self.padded} rows (one per neuron), got {tuple(values.shape)}")
        self._refuse_padding(values[self.width :], "write")
        w = self._weight("down_proj")
        w.copy_(values[: self.width].T.to(device=w.device, dtype=w.dtype))

    @torch.no_grad()
    def write_value_rows(self, neurons: Tensor, rows: Tensor) -> None:
        """Replace the value vectors of ``neurons`` (1-D indices in ``[0, padded)``) by ``rows``; a padding
        neuron's row must be 0 (it is then left as it is: padding has no weights)."""
        neurons = torch.as_tensor(neurons).flatten().long().cpu()
        if neurons.numel() and not (int(neurons.min()) >= 0 and int(neurons.max()) < self.padded):
            raise ValueError(f"neuron indices must be in [0, {self.padded}), got {neurons.tolist()!r:.200}")
        real = neurons < self.width
        self._refuse_padding(rows[~real.to(rows.device)], "write_rows")
        w = self._weight("down_proj")
        w[:, neurons[real].to(w.device)] = rows[real.to(rows.device)].T.to(device=w.device, dtype=w.dtype)


def dense_block(model: Model, layer: int, padded: int, moe: MoE | None = None, label: str | None = None) -> DenseBlock:
    """Layer ``layer``'s dense FFN on a ``padded``-wide neuron axis (the experts' axis ``moe.width`` in a
    model whose other layers are MoE; the widest layer's in a dense model whose layers differ in width);
    refused where it is not an MLP (gate_proj where gated, up_proj, down_proj, act_fn), is wider than
    that axis, or computes something else than ``down(act(gate(x)) * up(x))`` (``down(act(up(x)))``
    without a gate) on random inputs. ``label``: the family, for messages (at load, before the model has
    its record; by default the record's name and architecture)."""
    if label is None:
        fam = family_of(model)
        label = f"{fam.name} ({fam.architecture})"
    mlp = getattr(model.blocks[layer], "mlp", None)
    block = named_gated(unwrap(mlp))
    where = f"{label}, layer {layer}"
    if mlp is None:
        raise UnsupportedFamily(
            f"{where}: the bridge's block has no MLP module (a hybrid layer: state-space, convolution or "
            "linear-attention mixer) between expert layers; capinterp needs an FFN in every layer"
        )
    if not is_mlp(block):
        raise UnsupportedFamily(
            f"{where}: a dense layer that is not an MLP with up_proj, down_proj and act_fn (gate_proj where gated), "
            f"or w1, w3 and w2 ({type(block).__name__}); capinterp serves only such dense layers on a padded "
            "neuron axis"
        )
    width = int(unwrap(block.down_proj).in_features)
    if width > padded:
        axis = (
            f"an expert layer's {padded} ({moe.n_experts} x {moe.d_expert} + {moe.d_shared} shared)" if moe else padded
        )
        raise UnsupportedFamily(
            f"{where}: the dense FFN has {width} neurons, more than {axis}; capinterp pads a dense layer's neurons "
            "onto the experts' neuron axis and cannot fit a wider one"
        )
    return _checked_dense(where, DenseBlock(layer=layer, block=block, width=width, padded=padded))


@torch.no_grad()
def _checked_dense(where: str, spec: DenseBlock) -> DenseBlock:
    """``spec`` after checking that its forward computes the transformers MLP's own output on random
    inputs, and that its padding neurons are 0: a dense MLP taking another step is refused here."""
    from transformer_lens.hook_points import HookPoint

    like = unwrap(spec.block.down_proj).weight
    x = torch.randn(2, 6, int(like.shape[0]), generator=torch.Generator().manual_seed(0))
    x = x.to(device=like.device, dtype=like.dtype)
    # a clamping MLP (DeepSeek-V4's limit) is checked on inputs large enough that its clamps bite too
    err, bad, pad = 0.0, False, False
    for scale in (1.0, 100.0) if getattr(spec.block, "limit", None) is not None else (1.0,):
        want = spec.block(x * scale)
        seen: dict[str, Tensor] = {}
        probe = HookPoint()
        probe.add_hook(lambda act, hook: seen.setdefault("neurons", act.detach().clone()))
        try:
            got = spec.forward(probe, x * scale)
        finally:
            probe.remove_hooks()
        tol = max(1e-4, 16 * torch.finfo(like.dtype).eps) * max(1.0, float(want.abs().max()))
        diff = float((got.float() - want.float()).abs().max())
        err, bad = max(err, diff), bad or diff > tol
        pad = pad or bool(seen["neurons"][..., spec.width :].any())
    if bad or pad:
        form = "act_fn(gate_proj(x)) * up_proj(x)" if hasattr(spec.block, "gate_proj") else "act_fn(up_proj(x))"
        raise UnsupportedFamily(
            f"{where}: the dense layer's output is not down_proj({form}) "
            f"({type(module_of(spec.block)).__name__} differs by {err:.3g}); its neurons are "
            "not defined"
        )
    return spec
