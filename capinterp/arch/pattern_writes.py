"""Whether writing ``blocks.{l}.attn.hook_pattern`` reaches a model's output.

On some TransformerBridge adapters (TransformerLens 4.3: GPT-J, GPT-Neo, OPT, XGLM, NanoChat,
Llama 4, JetMoE, AFMoE and Laguna among the tiny models of the family matrix) the attention output
is computed without the hooked pattern: the hook only observes, so a write there changes nothing
and its gradient is 0. A method that writes the pattern (attention scaling) or reads its gradient
(AtP*'s QK fix) would then report a plausible "no effect". :func:`require_pattern_writes` probes
each layer once per model (the last query's whole row set to 0 must move the last position's
logits) and refuses such a model naming the family.
"""

from __future__ import annotations

from typing import Any

import torch

from capinterp.arch.family import UnsupportedFamily, family_of
from capinterp.core.protocol import Model

__all__ = ["require_pattern_writes"]


@torch.no_grad()
def require_pattern_writes(model: Model, layers: list[int], what: str) -> None:
    """UnsupportedFamily, naming ``what`` and the family, unless a write to each of ``layers``'
    ``attn.hook_pattern`` moves the model's output (probed once per layer and model)."""
    checked: set[int] = model.__dict__.setdefault("capinterp_pattern_writes", set())
    todo = [l for l in layers if l not in checked]
    if not todo:
        return
    bos = getattr(model.tokenizer, "bos_token_id", None) or 0
    ids = torch.tensor([[bos, 5, 6, 7, 8]], device=model.cfg.device) % int(model.cfg.d_vocab)
    clean = model(ids)[0, -1]

    def zero_last_row(pattern: torch.Tensor, hook: Any) -> torch.Tensor:
        pattern = pattern.clone()
        pattern[..., -1, :] = 0.0
        return pattern

    for l in todo:
        moved = model.run_with_hooks(ids, fwd_hooks=[(f"blocks.{l}.attn.hook_pattern", zero_last_row)])[0, -1]
        if torch.equal(moved, clean):
            fam = family_of(model)
            raise UnsupportedFamily(
                f"{fam.name} ({fam.architecture}): writing blocks.{l}.attn.hook_pattern does not reach the model's "
                f"output (the bridge computes this attention without the hooked pattern; the hook only observes), "
                f"so {what} would report no effect; it is refused"
            )
        checked.add(l)
