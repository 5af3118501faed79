"""capinterp's KN scores against EleutherAI's ``knowledge-neurons`` 0.0.2, side by side.

    .venv/bin/python benchmarks/bench_vs_kn.py                        # tiny model, a quick check
    .venv/bin/python benchmarks/bench_vs_kn.py --model smollm2 --n 2 --layers 8

The same weights, prompts and integral on both sides: KN's score (Dai et al., "Knowledge Neurons in
Pretrained Transformers", arXiv:2104.08696) of every FFN neuron, the post-activation neuron at the
last prompt token scaled jointly from 0, F = p(first answer token), with the package's own rule
(``linspace``: alpha_k = (k-1)/(m-1), weights 1/m; capinterp's ``rule="linspace"``). capinterp: one
``ig_scores`` call, ``route="fast"``. knowledge-neurons: ``KnowledgeNeurons.get_scores_for_layer``
per layer, all steps in one batch, parameters frozen on both sides.

The package's GPT default (``input_ff_attr="mlp.c_fc"``) scores the pre-GELU values; here its
``input_ff_attr`` points at an identity module inserted in front of each layer's down-projection,
whose output is the post-activation neuron (act(gate) * up), and its tokenizer is a shim that hands
it capinterp's token ids, so both score the same tokens.

Needs the package, installed without its (old, pinned) dependencies:
``pip install --no-deps knowledge-neurons==0.0.2`` (the ``peers`` extra of pyproject.toml).
"""

from __future__ import annotations

import contextlib

import torch
from peers import compare_ig, ig_main


class _Neurons(torch.nn.Module):
    """down_proj(post(x)): ``post`` (an identity) outputs the post-activation FFN neurons."""

    def __init__(self, down: torch.nn.Module):
        super().__init__()
        self.post, self.down = torch.nn.Identity(), down

    def forward(self, x):
        return self.down(self.post(x))


class _View(torch.nn.Module):
    """What knowledge-neurons sees: the model, and ``neurons[l].post`` as layer l's FFN output."""

    def __init__(self, hf: torch.nn.Module, neurons: list[_Neurons]):
        super().__init__()
        self.hf, self.neurons = hf, neurons  # a plain list: not registered twice

    def forward(self, **kw):
        return self.hf(**kw)


class _Tokens:
    """A tokenizer shim: the prompt's and target's ids as capinterp encoded them."""

    def __init__(self, tok, enc):
        self.tok, self.enc = tok, enc

    def encode(self, text):
        return [self.enc.target_ids[0]]

    def decode(self, ids):
        return self.tok.decode(ids)


@contextlib.contextmanager
def _neuron_modules(hf: torch.nn.Module):
    """Put a :class:`_Neurons` in front of every transformers MLP's ``down_proj``; restore on exit."""
    mlps = [m for m in hf.modules() if type(m).__module__.startswith("transformers") and hasattr(m, "down_proj")]
    if not mlps:
        raise ValueError(f"{type(hf).__name__} has no MLP with a down_proj (a Llama-shaped model is needed)")
    olds = [m.down_proj for m in mlps]
    try:
        for m, d in zip(mlps, olds):
            m.down_proj = _Neurons(d)
        yield [m.down_proj for m in mlps]
    finally:
        for m, d in zip(mlps, olds):
            m.down_proj = d


def kn_scores(model, enc, steps: int, layers: list[int]) -> torch.Tensor:
    """knowledge-neurons' ``get_scores_for_layer`` on each of ``layers``: [len(layers), d_mlp]."""
    from knowledge_neurons import KnowledgeNeurons

    hf = model.original_model
    ids = torch.tensor([enc.prompt_ids], device=model.cfg.device)
    encoded = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    with _neuron_modules(hf) as neurons:
        kn = KnowledgeNeurons(_View(hf, neurons), _Tokens(model.tokenizer, enc), "gpt", device=model.cfg.device)
        kn.transformer_layers_attr, kn.input_ff_attr = "neurons", "post"
        out = [
            kn.get_scores_for_layer("", "", layer_idx=l, batch_size=steps, steps=steps, encoded_input=encoded)
            for l in layers
        ]
    return torch.stack(out).detach().float().cpu()


def compare(model, n: int = 2, steps: int = 20, layers: list[int] | None = None) -> tuple[dict, float, float]:
    """(agreement, capinterp seconds, knowledge-neurons seconds) over ``n`` facts and ``layers``."""
    return compare_ig(model, n, steps, layers, "linspace", lambda m, e, s, ls: kn_scores(m, e, s, ls))


def main(argv: list[str] | None = None) -> int:
    names = ("knowledge-neurons 0.0.2", "KN scores (post-activation, last prompt token)")
    hint = "install it with: pip install --no-deps knowledge-neurons==0.0.2"
    return ig_main(argv, __doc__, module="knowledge_neurons", hint=hint, min_steps=2, compare=compare, names=names)


if __name__ == "__main__":
    raise SystemExit(main())
