"""The work a fit will do, counted before it runs (:class:`Work`), and the FLOP counts it is made
of: the counting half of :mod:`capinterp.localizers.cost`, which turns it into seconds."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from capinterp.core.protocol import Model

__all__ = ["Work", "block_flops", "unembed_flops", "weight_bytes"]


# --------------------------------------------------------------------------------- model shape
def _shape(model: Model) -> dict[str, int]:
    cfg = model.cfg
    n_heads = int(getattr(cfg, "n_heads", 1) or 1)
    d_model = int(cfg.d_model)
    d_head = int(getattr(cfg, "d_head", 0) or d_model // n_heads)
    return {
        "n_layers": int(cfg.n_layers),
        "d_model": d_model,
        "d_mlp": int(cfg.d_mlp),
        "d_vocab": int(cfg.d_vocab),
        "n_heads": n_heads,
        "d_head": d_head,
        "n_kv": int(getattr(cfg, "n_key_value_heads", None) or n_heads),
        "gated": 3 if getattr(cfg, "gated_mlp", False) else 2,
    }


def block_flops(shape: dict[str, int], context: float) -> float:
    """FLOPs of one token through one block that attends to ``context`` tokens."""
    qo = 2 * shape["n_heads"] * shape["d_head"]
    kv = 2 * shape["n_kv"] * shape["d_head"]
    proj = 2 * shape["d_model"] * (qo + kv)
    scores = 4 * context * shape["n_heads"] * shape["d_head"]
    mlp = 2 * shape["d_model"] * shape["d_mlp"] * shape["gated"]
    return float(proj + scores + mlp)


def unembed_flops(shape: dict[str, int]) -> float:
    return 2.0 * shape["d_model"] * shape["d_vocab"]


def _elem(model: Model) -> int:
    return torch.finfo(next(model.parameters()).dtype).bits // 8


def weight_bytes(model: Model) -> int:
    return int(sum(p.numel() * p.element_size() for p in model.parameters()))


# -------------------------------------------------------------------------------------- work
@dataclass
class Work:
    """The passes a fit will run, counted before it runs.

    Each :meth:`add` is ``calls`` passes of ``rows`` rows x ``tokens`` tokens through ``blocks``
    blocks (attending to ``context`` tokens), unembedding ``logits`` positions per row; ``grad``:
    with a backward to the activations, ``"params"``: to every parameter (a fine-tune).
    ``part`` names the line of the breakdown it counts towards.
    """

    model: Model
    # keyed by (part, kind); kind: "forward" (no-grad passes), "backward" (passes with a backward
    # through the bridge), "direct" (the IG kernels' direct block calls with a backward), "extra"
    # (products outside the passes), "bytes" (memory traffic): each kind has its measured scale
    fwd_flops: dict[tuple[str, str], float] = field(default_factory=dict)
    bwd_flops: dict[tuple[str, str], float] = field(default_factory=dict)
    block_calls: dict[tuple[str, str], float] = field(default_factory=dict)
    head_calls: dict[tuple[str, str], float] = field(default_factory=dict)
    direct_calls: dict[tuple[str, str], float] = field(default_factory=dict)
    moved_bytes: dict[tuple[str, str], float] = field(default_factory=dict)
    passes: int = 0
    rows: int = 0
    working_bytes: int = 0
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.shape = _shape(self.model)
        self.elem = _elem(self.model)

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    def add(
        self,
        part: str,
        *,
        rows: int,
        tokens: float,
        blocks: float | None = None,
        logits: float = 1,
        context: float | None = None,
        calls: int = 1,
        grad: bool | str = False,
        count_rows: bool = False,
        call_blocks: float | None = None,
        direct: bool = False,
    ) -> None:
        sh = self.shape
        blocks = sh["n_layers"] if blocks is None else blocks
        context = tokens if context is None else context
        per = rows * tokens * blocks * block_flops(sh, context) + rows * logits * unembed_flops(sh)
        flops = calls * per
        key = (part, "direct" if direct and grad else "backward" if grad else "forward")
        self.fwd_flops[key] = self.fwd_flops.get(key, 0.0) + flops
        # a backward calls every block (and reads its weights) once more
        times = 1 + (2 if grad == "params" else 1 if grad else 0)
        n_calls = calls * (blocks if call_blocks is None else call_blocks) * times
        calls_of = self.direct_calls if direct else self.block_calls
        calls_of[key] = calls_of.get(key, 0.0) + n_calls
        self.head_calls[key] = self.head_calls.get(key, 0.0) + calls * times
        if grad:
            factor = 2.0 if grad == "params" else 1.0  # gradients of the weights too: about twice the work
            self.bwd_flops[key] = self.bwd_flops.get(key, 0.0) + factor * flops
        self.passes += int(calls)
        if count_rows:
            self.rows += int(calls * rows)

    def flops(self, part: str, n: float) -> None:
        """``n`` FLOPs outside the model's passes (e.g. DCSN's projections through the unembedding)."""
        key = (part, "extra")
        self.fwd_flops[key] = self.fwd_flops.get(key, 0.0) + float(n)

    def memory(self, nbytes: float) -> None:
        """The fit holds ``nbytes`` beyond the weights at some point: the peak is the largest such."""
        self.working_bytes = max(self.working_bytes, int(nbytes))

    def traffic(self, part: str, nbytes: float, kind: str = "bytes") -> None:
        """Memory-bound work not tied to passes (an optimizer step over every parameter): bytes moved
        (``kind="digest"``: bytes hashed by the weights fingerprint, at its measured rate)."""
        key = (part, kind)
        self.moved_bytes[key] = self.moved_bytes.get(key, 0.0) + float(nbytes)

    def merge(self, other: Work) -> None:
        for mine, theirs in (
            (self.fwd_flops, other.fwd_flops),
            (self.bwd_flops, other.bwd_flops),
            (self.block_calls, other.block_calls),
            (self.head_calls, other.head_calls),
            (self.direct_calls, other.direct_calls),
            (self.moved_bytes, other.moved_bytes),
        ):
            for k, v in theirs.items():
                mine[k] = mine.get(k, 0.0) + v
        self.passes += other.passes
        self.rows += other.rows
        self.working_bytes = max(self.working_bytes, other.working_bytes)
        self.notes += [n for n in other.notes if n not in self.notes]
