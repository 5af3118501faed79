"""Where a mixture-of-experts layer's neurons keep their weights.

:class:`ExpertValues` is the layer's value vectors as one ``[d_mlp, d_model]`` matrix (read as a
copy, written back into each expert's own 3-D weight, a latent MoE's routed rows through fc2's
range), and :func:`owned_entries`, the entries each neuron owns in the stacked weights. The layers themselves: :mod:`capinterp.arch.experts`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from capinterp.arch.dense_layers import DenseBlock
from capinterp.arch.experts import ExpertBlock
from capinterp.arch.family import UnsupportedFamily
from capinterp.arch.gated_mlp import FusedNames, input_projections, unwrap

__all__ = ["ExpertValues", "owned_entries"]


@dataclass(frozen=True, eq=False)
class ExpertValues:
    """An MoE layer's down projections as one ``[n_experts * d_expert + d_shared, d_model]`` matrix of
    value vectors (the interface of :class:`capinterp.arch.weights.DownProjection`): read as a
    copy, written back into each expert's own weight. On a dense layer of a mixed model
    (:class:`DenseBlock`) the same ``[d_mlp, d_model]`` matrix: the dense down projection's columns,
    then the padding's rows, always 0 (writing a non-zero row or delta there is a ValueError)."""

    layer: int
    spec: ExpertBlock | DenseBlock

    def values(self) -> Tensor:
        """The value vectors, one row per neuron (a copy: the experts' weights are 3-D)."""
        return self.spec.values()

    def apply(self, keys: Tensor) -> Tensor:
        """``keys @ values()`` in float32: the layer's output from its neurons, without biases."""
        return keys.float() @ self.values().float().to(keys.device)

    @torch.no_grad()
    def write(self, values: Tensor) -> None:
        """Replace every value vector by the rows of ``values`` (``[d_mlp, d_model]``)."""
        if isinstance(self.spec, DenseBlock):
            self.spec.write_values(values)
            return
        spec, w = self.spec, self.spec.experts.down_proj
        n = spec.n_experts * spec.d_expert
        if spec.latent is not None:
            _latent_rows(spec, torch.arange(n), values[:n])
        else:
            routed = values[:n].reshape(spec.n_experts, spec.d_expert, -1)
            (w if spec.experts.is_transposed else w.transpose(1, 2)).copy_(routed.to(device=w.device, dtype=w.dtype))
        if spec.shared is not None:
            s = spec.shared.down_proj.weight
            s.copy_(values[spec.n_experts * spec.d_expert :].T.to(device=s.device, dtype=s.dtype))

    @torch.no_grad()
    def write_rows(self, neurons: Tensor, rows: Tensor) -> None:
        """Replace the value vectors of ``neurons`` (1-D flat indices) by ``rows``, in each expert's own weight."""
        if isinstance(self.spec, DenseBlock):
            self.spec.write_value_rows(neurons, rows)
            return
        spec = self.spec
        routed = spec.n_experts * spec.d_expert
        mine = neurons < routed
        if spec.latent is not None:  # the routed rows through fc2's range, the rest below
            _latent_rows(spec, neurons[mine], rows[mine.to(rows.device)])
            neurons, rows = neurons[~mine], rows[(~mine).to(rows.device)]
        for i, row in zip(neurons.tolist(), rows):
            if i < routed:
                target = spec.column(i)
            else:
                assert spec.shared is not None
                target = spec.shared.down_proj.weight[:, i - routed]
            target.copy_(row.to(device=target.device, dtype=target.dtype))

    @torch.no_grad()
    def add(self, delta: Tensor) -> None:
        """``W += delta`` (``[d_mlp, d_model]``), summed in float32, stored in each weight's dtype."""
        values = self.values()
        self.write(values.float() + delta.float().to(values.device))


def _latent_rows(spec: ExpertBlock, neurons: Tensor, rows: Tensor) -> None:
    """Write value rows of a latent MoE's routed neurons. Such a row is ``fc2 @ column``, so a ``d_model``
    row is in reach only within fc2's range: each row's column is the least-squares solution, and a row
    that column does not reproduce (to 1e-4 of the row, 16-bit: 1e-2) is refused
    (:class:`UnsupportedFamily`) before anything is written. Restoring, scaling and zeroing a row are
    in reach; a new direction outside fc2's range is not."""
    assert spec.latent is not None
    w, fc2 = spec.experts.down_proj, spec.latent[1].weight
    a = fc2.detach().double()  # [d_model, latent]
    want = rows.to(device=a.device, dtype=torch.float64)
    cols = torch.linalg.lstsq(a, want.T).solution.T if want.numel() else want[:, : a.shape[1]]
    tol = (1e-2 if w.dtype in (torch.float16, torch.bfloat16) else 1e-4) * want.norm(dim=1).clamp_min(1e-12)
    off = (cols @ a.T - want).norm(dim=1)
    if bool((off > tol).any()):
        raise UnsupportedFamily(
            f"layer {spec.layer}: a latent expert's value vector is fc2_latent_proj @ its column of the expert's "
            f"down projection, so a d_model vector can be written only within fc2's range (latent width "
            f"{a.shape[1]}); {int((off > tol).sum())} of these rows are not (off by up to {float((off / tol).max()):.3g} "
            "times the tolerance), and the edit is refused"
        )
    with torch.no_grad():
        for i, col in zip(neurons.tolist(), cols):
            target = spec.column(i)
            target.copy_(col.to(device=target.device, dtype=target.dtype))


def _pick(idx: Tensor, lo: int, hi: int) -> Tensor:
    return idx[(idx >= lo) & (idx < hi)] - lo


def owned_entries(spec: ExpertBlock | DenseBlock) -> list[tuple[str, str, Tensor, Any]]:
    """``(kind, attribute, parameter, where)`` for every parameter of layer ``spec`` that holds
    entries owned by single neurons; ``where(flat neuron indices)`` is the index (for ``p[...]``)
    of the entries those neurons own. An expert neuron owns its gate and up rows (and their bias
    entries) and its value vector in its expert's 3-D weights; the shared expert's neurons own
    their rows of its Linear layers. The experts' down biases are owned by no neuron. On a
    :class:`DenseBlock` a real neuron owns its gate and up rows and its down-projection column; a
    padding neuron owns nothing (its ``where`` is empty)."""
    if isinstance(spec, DenseBlock):  # a dense layer of a mixed model: its real neurons' rows and columns
        b = spec.block
        rows = lambda idx: (_pick(idx, 0, spec.width),)  # noqa: E731
        return [(kind, attr, unwrap(getattr(b, attr)).weight, rows) for kind, attr in input_projections(b)] + [
            ("W_out", "down_proj", unwrap(b.down_proj).weight, lambda idx: (slice(None), *rows(idx)))
        ]
    ex, d, routed = spec.experts, spec.d_expert, spec.n_experts * spec.d_expert
    out_axis = 2 if ex.is_transposed else 1  # where a projection's outputs sit in [E, ., .]

    def inputs(concatenated: bool, gated: bool):
        def where(idx: Tensor) -> tuple:
            idx = _pick(idx, 0, routed)
            e, i = idx // d, idx % d
            if gated:
                e, i = torch.cat([e, e]), (torch.cat([i, i + d]) if concatenated else torch.cat([2 * i, 2 * i + 1]))
            return (e, i) if out_axis == 1 else (e, slice(None), i)

        return where

    def bias(concatenated: bool, gated: bool):
        rows = inputs(concatenated, gated)
        return lambda idx: tuple(t for t in rows(idx) if not isinstance(t, slice))

    def values(idx: Tensor) -> tuple:
        idx = _pick(idx, 0, routed)
        e, i = idx // d, idx % d
        return (e, i) if ex.is_transposed else (e, slice(None), i)

    gated, concat = bool(ex.has_gate), bool(getattr(ex, "is_concatenated", True))
    name = "gate_up_proj" if gated else "up_proj"
    found = [("W_gate_up" if gated else "W_in", name, getattr(ex, name), inputs(concat, gated))]
    if ex.has_bias:
        found.append(
            ("b_gate_up" if gated else "b_in", f"{name}_bias", getattr(ex, f"{name}_bias"), bias(concat, gated))
        )
    found.append(("W_out", "down_proj", ex.down_proj, values))
    if isinstance(spec.shared, FusedNames):  # gate rows j, up rows d_shared + j of one fused weight
        sh, ds = spec.shared, spec.d_shared
        rows = lambda idx: (_pick(idx, routed, routed + ds),)  # noqa: E731
        found += [
            (
                "W_gate_up",
                "shared.input_linear",
                sh.fused.weight,
                lambda idx: (torch.cat([rows(idx)[0], rows(idx)[0] + ds]),),
            ),
            ("W_out", "shared.output_linear", sh.down_proj.weight, lambda idx: (slice(None), *rows(idx))),
        ]
    elif spec.shared is not None:
        sh = spec.shared
        rows = lambda idx: (_pick(idx, routed, routed + spec.d_shared),)  # noqa: E731
        found += [(kind, f"shared.{attr}", getattr(sh, attr).weight, rows) for kind, attr in input_projections(sh)]
        found.append(("W_out", "shared.down_proj", sh.down_proj.weight, lambda idx: (slice(None), *rows(idx))))
    return found
