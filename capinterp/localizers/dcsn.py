"""DCSN: capability-specific neurons by activation x unembedding projection (papers/003, Eq. 1).

    C[l, i] = mean_j  a^l_{j,i} * (W_out[l] @ W_U)[i, t_j]

``a^l_{j,i}`` is neuron (l, i)'s activation (``hook_post``) at the last prompt token of sample
j, and ``t_j`` the first gold answer token (``target="gold"``) or the model's greedy prediction
(``target="pred"``, as FiNE does). The projection uses the *raw* weights (TransformerBridge
does no weight processing by default), so it is the neuron's direct effect on the target
logit through its value vector, ignoring the final norm (and, on Gemma 3, the post-FFN norm:
there it is only an approximation of the direct effect). Cost: one forward per prompt.
The mask is CNL's: ``|C - mean| > sigma * std``, global and two-sided.
"""
from __future__ import annotations

from typing import Any

import torch

from capinterp.forward import logits_at
from capinterp.localizers.base import register
from capinterp.localizers.dataset import DatasetNeuronLocalizer
from capinterp.model import neuron_hook, neuron_shape
from capinterp.tokens import Encoded, collate, pad_id


@torch.no_grad()
def last_token_activations(model, items: list[Encoded]) -> tuple[torch.Tensor, torch.Tensor]:
    """``hook_post`` of every layer at each prompt's last token: ``[n, n_layers, d_mlp]``, and logits there."""
    n_layers, d_mlp = neuron_shape(model)
    batch = collate(items, pad_id(model.tokenizer), with_target=False, device=model.cfg.device)
    rows = torch.arange(len(items), device=batch.tokens.device)
    last = batch.lengths - 1
    acts = torch.empty(len(items), n_layers, d_mlp, device=batch.tokens.device)

    def grab(act, hook):
        acts[:, int(hook.name.split(".")[1])] = act[rows, last].float()

    logits = logits_at(model, batch.tokens, last, fwd_hooks=[(neuron_hook(l), grab) for l in range(n_layers)])
    return acts, logits


def projection(model, layer: int, token_ids: torch.Tensor) -> torch.Tensor:
    """``(W_out[layer] @ W_U)[:, token_ids]`` -> ``[d_mlp, len(token_ids)]``, only the needed columns."""
    w_out = model.blocks[layer].mlp.W_out  # [d_mlp, d_model], raw weights
    return (w_out @ model.W_U[:, token_ids]).float()


@register("dcsn")
class DCSN(DatasetNeuronLocalizer):
    """Activation x unembedding-projection scores, averaged over a dataset.

    Args:
        sigma: mask threshold in standard deviations (papers/003 Table 12 peaks at 6).
        target: ``"gold"`` (first gold answer token) or ``"pred"`` (the model's argmax).
    """

    def __init__(self, model: Any, *, sigma: float = 6.0, target: str = "gold", **kwargs: Any) -> None:
        super().__init__(model, sigma=sigma, **kwargs)
        if target not in ("gold", "pred"):
            raise ValueError(f"target must be 'gold' or 'pred', got {target!r}")
        self.target = target
        self.chunk_examples = self.batch_size

    @torch.no_grad()
    def _score_chunk(self, items: list[Encoded]) -> torch.Tensor:
        acts, logits = last_token_activations(self.model, items)
        if self.target == "gold":
            tok = torch.tensor([it.target_ids[0] for it in items], device=acts.device)
        else:
            tok = logits.argmax(-1)
        out = torch.empty_like(acts)
        for l in range(acts.shape[1]):
            out[:, l] = acts[:, l] * projection(self.model, l, tok).T
        return out.cpu()
