"""Plant known neurons in a tiny Llama bridge: each drives one target token's logit.

For a planted neuron (l, i) we set its gate and up rows to the mean normalized MLP input at
the prompts' last token (so it fires strongly there) and its down-projection column to the
target token's unembedding direction (so it writes that token's logit). Layers are planted
bottom-up, re-reading the inputs after each edit.
"""

from __future__ import annotations

import torch

from capinterp.core.tokens import collate, encode, pad_id

PLANTED = [(1, 5), (2, 17), (3, 40)]
#: sums that all answer "7": the data the planted neurons serve in the faithfulness tests
SEVENS = [(3, 4), (5, 2), (1, 6), (2, 5), (6, 1), (4, 3)]


@torch.no_grad()
def plant(model, examples, neurons=PLANTED, gain: float = 3.0, write: float = 0.6):
    items = encode(model, examples)
    target = items[0].target_ids[0]
    assert all(it.target_ids[0] == target for it in items), "planting needs one shared target token"
    batch = collate(items, pad_id(model.tokenizer), with_target=False)
    rows = torch.arange(len(items))
    u = model.W_U[:, target]
    for layer, idx in sorted(neurons):
        _, cache = model.run_with_cache(batch.tokens, names_filter=lambda n: n == f"blocks.{layer}.ln2.hook_out")
        x = cache[f"blocks.{layer}.ln2.hook_out"][rows, batch.lengths - 1].mean(0)
        mlp = model.blocks[layer].mlp
        direction = x / x.norm()
        mlp.gate.original_component.weight[idx] = gain * direction
        getattr(mlp, "in").original_component.weight[idx] = gain * direction
        mlp.out.original_component.weight[:, idx] = write * u / u.norm()
    return target


#: Neurons that end a planted answer (see :func:`plant_answer`).
ENDERS = [(1, 60), (2, 70), (3, 80)]


@torch.no_grad()
def plant_answer(model, examples, neurons=PLANTED, enders=ENDERS):
    """Plant ``neurons`` to write the shared target after each prompt, and ``enders`` to write "."
    after the target, so greedy decoding says the whole answer and stops ("7." rather than "77":
    a continuation that goes on with the same digit is another number, judged wrong)."""
    from capinterp.core.example import Example

    target = plant(model, examples, neurons)
    plant(model, [Example(e.prompt + e.target, ".") for e in examples], enders)
    return target


def planted_scores(model, planted=PLANTED):
    """NeuronScores ranking the planted neurons first (10.0) over small seeded noise (< 0.1)."""
    from capinterp.arch.model import neuron_shape
    from capinterp.units.neurons import NeuronScores

    L, d = neuron_shape(model)
    s = torch.rand(L, d, generator=torch.Generator().manual_seed(0)) * 0.1
    for l, i in planted:
        s[l, i] = 10.0
    return NeuronScores(s)
