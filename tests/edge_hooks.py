"""Hand-written references for circuit edges: which plain-model hook carries a graph node's value.

Source nodes (``input``, ``m{l}``, ``a{l}.h{h}``) write into the residual stream; slots
(``logits``, ``m{l}``, ``a{l}.{q|k|v}{i}``) read from it. The hand-written patched forwards of the
edge tests hook these names directly, never capinterp's own graph code.
"""

from __future__ import annotations


def source_hook(name: str) -> tuple[str, int | None]:
    """The plain model's hook carrying a source node's output (and the head index in it)."""
    if name == "input":
        return "blocks.0.hook_resid_pre", None
    if name.startswith("m"):
        return f"blocks.{name[1:]}.hook_mlp_out", None
    layer, head = name[1:].split(".h")
    return f"blocks.{layer}.attn.hook_result", int(head)


def slot_hook(name: str) -> tuple[str, int | None]:
    """The plain model's hook carrying a slot's input (and the head / KV group index in it)."""
    if name == "logits":
        return "ln_final.hook_in", None
    if name.startswith("m"):
        return f"blocks.{name[1:]}.hook_mlp_in", None
    head, kind = name.split("<")
    layer, unit = head[1:].split(".")
    return f"blocks.{layer}.hook_{kind}_input", int(unit[1:])
