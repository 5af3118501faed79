"""capinterp's KN integrated gradients against captum's ``LayerIntegratedGradients``, side by side.

    .venv/bin/python benchmarks/bench_vs_captum.py                      # tiny model, a quick check
    .venv/bin/python benchmarks/bench_vs_captum.py --model smollm2 --n 2 --layers 8

The same weights, prompts and integral on both sides: KN's score (Dai et al., "Knowledge Neurons in
Pretrained Transformers", arXiv:2104.08696) of every FFN neuron of each layer, i.e. the
down-projection input at the last prompt token scaled jointly from 0 to its value, F = p(first
answer token), the right Riemann rule with ``--steps`` points. capinterp: one ``ig_scores`` call,
``route="fast"``, ``positions="last_prompt"``. captum: one ``LayerIntegratedGradients.attribute``
per layer on the plain transformers model (all points in one batch, parameters frozen as capinterp
freezes them); its layer is an identity on the last position's activation, whose baseline (the
second input, a gate at 0) is the zero vector. Both run in this process, prompt by prompt.

Prints max |diff| and Spearman's rank correlation of all scores, both wall times and their ratio.
Needs captum (``pip install --no-deps captum``; captum imports matplotlib).
"""

from __future__ import annotations

import torch
from peers import compare_ig, hf_module, ig_main


def captum_kn(model, enc, steps: int, layer: int) -> torch.Tensor:
    """captum's LayerIntegratedGradients for KN's integral at one layer: [d_mlp] float32."""
    from captum.attr import LayerIntegratedGradients

    hf = model.original_model
    down = hf_module(hf, layer, "mlp.down_proj")
    pick = torch.nn.Identity()  # captum's layer: the last prompt position's neurons
    state: dict[str, torch.Tensor] = {}

    def put(mod, args):
        x = args[0]
        last = pick(x[:, -1] * state["gate"].to(x.dtype))
        return (torch.cat([x[:, :-1], last[:, None]], 1),)

    def prob(ids, gate):
        state["gate"] = gate
        return hf(ids).logits[:, -1].float().log_softmax(-1)[:, enc.target_ids[0]].exp()

    ids = torch.tensor([enc.prompt_ids], device=model.cfg.device)
    one = torch.ones(1, 1, device=model.cfg.device)
    hook = down.register_forward_pre_hook(put)
    try:
        out = LayerIntegratedGradients(prob, pick).attribute(
            (ids, one),
            baselines=(ids, torch.zeros_like(one)),
            n_steps=steps,
            method="riemann_right",
            internal_batch_size=steps,
        )
    finally:
        hook.remove()
    return out[0].detach().float().cpu()


def _captum_layers(model, enc, steps: int, layers: list[int]) -> torch.Tensor:
    return torch.stack([captum_kn(model, enc, steps, l) for l in layers])


def compare(model, n: int = 2, steps: int = 20, layers: list[int] | None = None) -> tuple[dict, float, float]:
    """(agreement, capinterp seconds, captum seconds) over ``n`` facts and ``layers`` (default all)."""
    return compare_ig(model, n, steps, layers, "right", lambda m, e, s, ls: _captum_layers(m, e, s, ls))


def main(argv: list[str] | None = None) -> int:
    names = ("captum LayerIntegratedGradients", "KN scores (last prompt token, p(answer))")
    hint = "install it with: pip install --no-deps captum matplotlib"
    return ig_main(argv, __doc__, module="captum.attr", hint=hint, min_steps=1, compare=compare, names=names)


if __name__ == "__main__":
    raise SystemExit(main())
