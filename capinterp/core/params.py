"""A model's parameters as memory: distinct entries, and deep copies that keep shared storage shared.

A bridge may register parameters that are views of another parameter: Phi-3's fused
``gate_up_proj`` is served through split ``gate`` / ``in`` Linears whose weights are slices of
the fused one, so training or editing the split views changes the model's own weight.
``copy.deepcopy`` clones every parameter separately and silently cuts that link (the copy's
transformers weight would then stay stale while the bridge trains its split views):
:func:`copy_model` re-links them. ``copy.deepcopy`` also keeps functions as they are, so a
forward patched per instance with a closure over its module (TransformerLens' Falcon adapter
does this for every ``FalconLinear``) would make the copy compute with the *original's*
weights: :func:`copy_model` points such closures at the copy's objects. :func:`count_entries` counts every stored entry once (tied
weights and views included once).
"""

from __future__ import annotations

import copy
import types
from collections.abc import Iterable
from typing import Any, cast

import torch

from capinterp.core.protocol import Model

__all__ = ["copy_model", "count_entries"]


def _key(p: torch.Tensor) -> tuple[str, int]:
    return str(p.device), p.untyped_storage().data_ptr()


def _span(p: torch.Tensor) -> tuple[int, int]:
    """``[first, last + 1)`` storage elements a (strided) tensor covers."""
    first = int(p.storage_offset())
    if p.numel() == 0:
        return first, first
    last = sum((int(n) - 1) * int(s) for n, s in zip(p.shape, p.stride()))
    return first, first + last + 1


def _distinct(group: list[torch.Tensor]) -> int:
    """Entries of one storage covered by at least one tensor of ``group``."""
    spans = [_span(p) for p in group]
    if all(hi - lo == p.numel() for p, (lo, hi) in zip(group, spans)):  # dense tensors: union of ranges
        total, end = 0, None
        for lo, hi in sorted(spans):
            if end is None or lo >= end:
                total, end = total + hi - lo, hi
            elif hi > end:
                total, end = total + hi - end, hi
        return total
    covered = torch.zeros(max(hi for _, hi in spans), dtype=torch.bool)  # strided views: mark each entry
    for p in group:
        if p.numel():
            covered[torch.arange(covered.numel()).as_strided(p.shape, p.stride(), p.storage_offset())] = True
    return int(covered.sum())


def count_entries(params: Iterable[torch.Tensor]) -> int:
    """Distinct stored entries of ``params``: entries shared by several tensors (tied weights,
    views of a fused weight) are counted once."""
    groups: dict[tuple[str, int], list[torch.Tensor]] = {}
    for p in params:
        key = ("meta", id(p)) if p.device.type == "meta" else _key(p)
        groups.setdefault(key, []).append(p)
    return sum(max(p.numel() for p in group) if key[0] == "meta" else _distinct(group) for key, group in groups.items())


def _views(model: torch.nn.Module) -> list[tuple[str, str]]:
    """``(view name, base name)`` for every parameter whose storage lies inside another's."""
    named = [(n, p) for n, p in model.named_parameters() if p.device.type != "meta"]
    groups: dict[tuple[str, int], list[tuple[str, torch.Tensor]]] = {}
    for n, p in named:
        groups.setdefault(_key(p), []).append((n, p))
    out: list[tuple[str, str]] = []
    for members in groups.values():
        if len(members) < 2:
            continue
        base_name, base = max(members, key=lambda m: m[1].numel())
        lo, hi = _span(base)
        for n, q in members:
            if n != base_name and lo <= _span(q)[0] and _span(q)[1] <= hi:
                out.append((n, base_name))
    return out


_EMPTY = object()


def _contents(cell: types.CellType) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # a cell not yet filled
        return _EMPTY


def _rebound(fn: types.FunctionType, memo: dict[int, Any]) -> types.FunctionType | None:
    """``fn`` with every closure cell holding a copied object pointed at its copy; None if none is."""
    cells = fn.__closure__ or ()
    if not any(id(_contents(c)) in memo for c in cells):
        return None
    new = types.FunctionType(
        fn.__code__,
        fn.__globals__,
        fn.__name__,
        fn.__defaults__,
        tuple(
            c if _contents(c) is _EMPTY else types.CellType(memo.get(id(c.cell_contents), c.cell_contents))
            for c in cells
        ),
    )
    new.__kwdefaults__ = fn.__kwdefaults__
    new.__dict__.update(fn.__dict__)
    new.__qualname__ = fn.__qualname__
    return new


def _rebind_closures(new: torch.nn.Module, memo: dict[int, Any]) -> None:
    """Point per-instance functions (patched forwards, hooks) of the copy's modules at the copy."""
    for mod in new.modules():
        for key, value in list(vars(mod).items()):
            if isinstance(value, types.FunctionType) and (fn := _rebound(value, memo)) is not None:
                mod.__dict__[key] = fn
        for hooks in (mod._forward_hooks, mod._forward_pre_hooks, mod._backward_hooks):
            for hid, value in list(hooks.items()):
                if isinstance(value, types.FunctionType) and (fn := _rebound(value, memo)) is not None:
                    hooks[hid] = fn


def copy_model(model: Model) -> Model:
    """A deep copy of ``model`` sharing its tokenizer (only read): parameters that were views of
    another parameter are again views of the copy's one (same shape, strides and offset), and
    functions set on its modules (patched forwards, hooks) whose closures held the model's own
    objects hold the copy's."""
    tok = getattr(model, "tokenizer", None)
    memo: dict[int, Any] = {id(tok): tok} if tok is not None else {}
    module = cast(torch.nn.Module, model)  # a bridge is an nn.Module
    links = _views(module)
    src = dict(model.named_parameters())
    new = copy.deepcopy(module, memo=memo)
    _rebind_closures(new, memo)
    if links:
        dst = dict(new.named_parameters())
        with torch.no_grad():
            for view, base in links:
                b, v, nb = src[base], src[view], dst[base]
                if nb.stride() != b.stride():
                    raise RuntimeError(f"copy_model: {base} changed its layout when copied; cannot re-link {view}")
                offset = v.storage_offset() - b.storage_offset() + nb.storage_offset()
                dst[view].data = nb.data.as_strided(v.shape, v.stride(), offset)
    return cast(Model, new)
