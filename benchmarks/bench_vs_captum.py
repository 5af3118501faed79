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

import argparse

import torch
from peers import FACTS, agreement, hf_module, report, require, timed

from capinterp.arch.model import load_model
from capinterp.core.tokens import encode
from capinterp.kernels.ig import frozen_params, ig_scores
from capinterp.kernels.ig_config import IGConfig


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


def compare(model, n: int = 2, steps: int = 20, layers: list[int] | None = None) -> tuple[dict, float, float]:
    """(agreement, capinterp seconds, captum seconds) over ``n`` facts and ``layers`` (default all)."""
    layers = list(range(int(model.cfg.n_layers))) if layers is None else layers
    encs = encode(model, FACTS[:n])
    cfg = IGConfig(steps=steps, rule="right", positions="last_prompt", invariance="off")
    ig_scores(model, encs[0], cfg.replace(steps=2), layers=layers[:1])  # warm-up, both sides
    with frozen_params(model):
        captum_kn(model, encs[0], 2, layers[0])
    ours, theirs, t_ours, t_peer = [], [], 0.0, 0.0
    for enc in encs:
        out, t = timed(lambda: ig_scores(model, enc, cfg, layers=layers)[0, layers])
        ours.append(out)
        t_ours += t
        with frozen_params(model):
            out, t = timed(lambda: torch.stack([captum_kn(model, enc, steps, l) for l in layers]))
        theirs.append(out)
        t_peer += t
    return agreement(torch.stack(ours), torch.stack(theirs)), t_ours, t_peer


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--n", type=int, default=2, help=f"facts (1..{len(FACTS)})")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--layers", type=int, default=None, help="the first k layers (default all)")
    ap.add_argument("--device", default=None)
    args = ap.parse_args(argv)
    if not 1 <= args.n <= len(FACTS) or args.steps < 1 or args.threads < 1:
        ap.error(f"--n must be in 1..{len(FACTS)}, --steps and --threads >= 1")
    require("captum.attr", "install it with: pip install --no-deps captum matplotlib")
    torch.set_num_threads(args.threads)
    model = load_model(args.model, device=args.device, threads=args.threads)
    n_layers = int(model.cfg.n_layers)
    layers = list(range(min(args.layers or n_layers, n_layers)))
    agree, t_ours, t_peer = compare(model, args.n, args.steps, layers)
    print(
        f"model {args.model}: {n_layers} layers x {model.cfg.d_mlp} neurons; {args.n} facts, layers 0..{layers[-1]}, "
        f"steps {args.steps}, threads {torch.get_num_threads()}"
    )
    print(report("captum LayerIntegratedGradients", "KN scores (last prompt token, p(answer))", agree, t_ours, t_peer))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
