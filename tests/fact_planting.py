"""Plant several facts in a tiny Llama bridge, each on its own neurons (query-localization tests).

Fact f (paraphrased prompts sharing one answer token) gets neurons whose up row is the mean
normalized MLP input u_f at its prompts' last token, whose gate row points from the other facts'
mean inputs towards u_f (so the neuron fires on f's prompts and is shut by SiLU on the others'),
and whose down-projection column writes f's answer unembedding direction. Layers are planted
bottom-up, re-reading the inputs after each layer's edit.
"""

from __future__ import annotations

import torch

from capinterp.core.tokens import collate, encode, pad_id
from capinterp.data import Example

FACT_A = [
    Example(p, " Paris")
    for p in (
        "The Eiffel Tower is in the city of",
        "The Eiffel Tower is located in the city of",
        "The Eiffel Tower was in the city of",
    )
]
FACT_B = [
    Example(p, " Tokyo")
    for p in ("The capital of Japan is", "The capital city of Japan is", "Japan has the capital that is")
]
NEURONS_A = [(1, 5), (2, 17), (3, 40)]
NEURONS_B = [(1, 60), (2, 70), (3, 90)]


def _last_inputs(model, examples, layer: int) -> torch.Tensor:
    items = encode(model, examples)
    batch = collate(items, pad_id(model.tokenizer), with_target=False)
    name = f"blocks.{layer}.ln2.hook_out"
    _, cache = model.run_with_cache(batch.tokens, names_filter=lambda n: n == name)
    return cache[name][torch.arange(len(items)), batch.lengths - 1]


@torch.no_grad()
def plant_facts(
    model, facts=(FACT_A, FACT_B), neurons=(NEURONS_A, NEURONS_B), gain: float = 3.0, write: float = 0.6
) -> list[int]:
    """Plant every fact on its neurons; returns the answer token id of each fact."""
    targets = []
    for fact in facts:
        ids = {it.target_ids[0] for it in encode(model, fact)}
        assert len(ids) == 1, "a planted fact needs one answer token"
        targets.append(ids.pop())
    layers = sorted({l for ns in neurons for l, _ in ns})
    for layer in layers:
        means = [torch.nn.functional.normalize(_last_inputs(model, f, layer).mean(0), dim=0) for f in facts]
        mlp = model.blocks[layer].mlp
        for f, (fact_neurons, target) in enumerate(zip(neurons, targets)):
            rest = torch.stack([m for g, m in enumerate(means) if g != f]).mean(0)
            gate = torch.nn.functional.normalize(means[f] - rest, dim=0)
            u = model.W_U[:, target]
            for l, idx in fact_neurons:
                if l != layer:
                    continue
                mlp.gate.original_component.weight[idx] = gain * gate
                getattr(mlp, "in").original_component.weight[idx] = gain * means[f]
                mlp.out.original_component.weight[:, idx] = write * u / u.norm()
    return targets
