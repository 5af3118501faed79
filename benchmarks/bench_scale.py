"""Time, memory and FLOPs per ~30-token prompt on a randomly initialised Llama-shaped model.

    .venv/bin/python benchmarks/bench_scale.py --config 1b --threads 2               # CPU
    python benchmarks/bench_scale.py --config llama2-7b --device cuda --dtype bfloat16  # one GPU

``--config``: ``llama2-7b`` (32 x 11008 neurons, 32k vocabulary), ``llama3-8b`` (32 x 14336,
128k vocabulary, 8 KV heads) ``1b`` (Llama-3.2-1B's shape: 16 x 8192, 128k vocabulary) or ``smoke`` (4 x 256, a check
that the script runs).
No weights are needed to measure time and memory. Side by side in one run, per prompt:

* ``ig``: CNL/KN integrated gradients over every neuron, the fast route (``route="fast"``);
* ``loop``: the same scores by the per-layer batched loop (``route="loop"``: m full sequences
  per layer, forward + backward);
* ``captum``: captum's ``LayerIntegratedGradients`` on each layer's down-projection input, the
  route a user would take (``--captum-layers k`` measures k layers and scales by n_layers/k;
  ``--loop-layers k`` does the same for ``loop``);
* ``dcsn``: one forward, activations x unembedding projection;
* ``trace``: ROME causal tracing of one fact (``--trace-kinds``, 10 noise samples);
* ``eap``: EAP-IG edge scores of one fact (knowledge circuits, ``--eap-steps`` points, the
  subject-noise corruption), over every edge of the head-level graph.

FLOPs are counted by ``torch.utils.flop_counter`` on one fast-IG call with m=1 and m=2 steps
(IG is linear in m). The cost model (:func:`ig_cost`) predicts the fast route's FLOPs and weight
traffic from the shape alone; the run prints its prediction next to the count, then the
prediction for the 7B / 8B shapes. Peak memory: ``torch.cuda.max_memory_allocated`` on a GPU,
the process's peak RSS on the CPU. Each method runs in a process of its own (the parent counts
FLOPs and compares scores), so every row's peak is that method's alone, model included.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

PRESETS = {
    "llama2-7b": dict(
        hidden_size=4096,
        intermediate_size=11008,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=32,
        vocab_size=32000,
    ),
    "llama3-8b": dict(
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        vocab_size=128256,
        rope_theta=500000.0,
    ),
    "smoke": dict(  # a few seconds per method: checks that the script runs
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        vocab_size=1000,
    ),
    "1b": dict(
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        vocab_size=128256,
        rope_theta=500000.0,
        tie_word_embeddings=True,
    ),
}


def block_params(c: dict) -> int:
    d, kv = c["hidden_size"], c["hidden_size"] * c["num_key_value_heads"] // c["num_attention_heads"]
    return 2 * d * d + 2 * d * kv + 3 * d * c["intermediate_size"]


def ig_cost(c: dict, seq: int, steps: int, n_pos: int = 1, batch_rows: int = 64, elem: int = 2) -> dict:
    """Fast-kernel IG of every neuron for one prompt, papers' rule: FLOPs and bytes of weights read.

    Clean prefix: one forward over ``seq`` tokens (2 P_block FLOPs per token per block). Rows:
    ``(steps - 1) x L`` (layer, step) pairs plus one clean row shared by all layers (the right
    rule's node at alpha = 1); a row scaled at layer l runs blocks l..L-1 (the clean row all L) on
    ``n_pos`` positions, forward and an input-gradient backward (x2: parameters need no
    gradient), and the unembedding at those positions (x2).
    Weight traffic: each chunk of ``batch_rows`` rows reads the blocks it spans, forward and back.
    """
    L, V, d = c["num_hidden_layers"], c["vocab_size"], c["hidden_size"]
    pb = block_params(c)
    prefix = 2 * pb * L * seq + 2 * d * V * n_pos
    n_rows = (steps - 1) * L + 1
    block_passes = (steps - 1) * L * (L + 1) // 2 + L
    rows = block_passes * n_pos * 2 * pb * 2 + n_rows * n_pos * 2 * d * V * 2
    n_chunks = -(-n_rows // batch_rows)
    traffic = n_chunks * (pb * L + d * V) * elem * 2
    return {"flops": prefix + rows, "weight_bytes": traffic}


def build(cfg_name: str, device: str, dtype: torch.dtype):
    from transformers import LlamaConfig, LlamaForCausalLM

    from capinterp.arch.model import load_model
    from capinterp.arch.tiny import tiny_tokenizer

    cfg = LlamaConfig(**PRESETS[cfg_name], max_position_embeddings=4096)
    torch.manual_seed(0)
    with torch.device(device):
        hf = LlamaForCausalLM(cfg).to(dtype)
    hf.config.architectures = ["LlamaForCausalLM"]
    return load_model(hf, tokenizer=tiny_tokenizer(), device=device, dtype=dtype)


def timed(fn, device: str):
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    t = time.perf_counter()
    out = fn()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() / 2**30
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    return out, time.perf_counter() - t, peak


def captum_ig(model, item, steps: int, layers: list[int]) -> None:
    from captum.attr import LayerIntegratedGradients

    hf = model.original_model
    ids = torch.tensor([item.prompt_ids], device=model.cfg.device)
    target = item.target_ids[0]

    def prob(x):
        return hf(x).logits[:, -1].float().softmax(-1)[:, target]

    for l in layers:
        lig = LayerIntegratedGradients(prob, hf.model.layers[l].mlp.down_proj)
        lig.attribute(
            ids, n_steps=steps, method="riemann_right", attribute_to_layer_input=True, internal_batch_size=steps
        )


def captum_neuron_ig(
    model, item, steps: int, layer: int, method: str = "gausslegendre", rule: tuple | None = None
) -> torch.Tensor:
    """KN's integral with captum's ``IntegratedGradients``: layer ``layer``'s down-projection input at
    the last prompt token scaled from 0 (all neurons jointly), F = p(first target token), full
    sequences through the plain transformers model, ``steps`` points in one batch. Attributions
    [d_mlp] (float32, CPU); the same integral as ``ig_scores(..., positions="last_prompt")``.

    ``rule=(alphas, weights)`` replaces captum's ``method`` by that rule (e.g. the adaptive rule's
    composite Gauss-Legendre, which captum's public ``attribute`` cannot take): it goes through
    captum's own ``IntegratedGradients._attribute(step_sizes_and_alphas=...)``, the call
    ``attribute`` makes per batch, all ``len(alphas)`` points in one batch."""
    from captum.attr import IntegratedGradients

    hf = model.original_model
    ids = torch.tensor([item.prompt_ids], device=model.cfg.device)
    target = item.target_ids[0]
    down = hf.model.layers[layer].mlp.down_proj
    clean: list[torch.Tensor] = []
    h = down.register_forward_pre_hook(lambda mod, args: clean.append(args[0][0, -1].detach()))
    with torch.no_grad():
        hf(ids)
    h.remove()

    def prob(a):
        def put(mod, args):
            x = args[0].expand(a.shape[0], -1, -1).clone()
            x[:, -1] = a.to(x.dtype)
            return (x,)

        hook = down.register_forward_pre_hook(put)
        try:
            return hf(ids.expand(a.shape[0], -1)).logits[:, -1].float().softmax(-1)[:, target]
        finally:
            hook.remove()

    a = clean[0][None].float()
    ig = IntegratedGradients(prob)
    if rule is not None:
        alphas, weights = (x.tolist() for x in rule)
        (out,) = ig._attribute(
            (a,), (torch.zeros_like(a),), n_steps=len(alphas), step_sizes_and_alphas=(weights, alphas)
        )
        return out[0].detach().float().cpu()
    out = ig.attribute(a, baselines=torch.zeros_like(a), n_steps=steps, method=method, internal_batch_size=steps)
    return out[0].detach().float().cpu()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="1b", choices=sorted(PRESETS))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--seq", type=int, default=30, help="prompt tokens (plus one answer token)")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch-size", type=int, default=64, help="IG rows per forward/backward")
    ap.add_argument("--methods", default="ig,loop,captum,dcsn")
    ap.add_argument("--captum-layers", type=int, default=1)
    ap.add_argument("--loop-layers", type=int, default=0, help="measure the loop on k layers, scale by L/k (0: all)")
    ap.add_argument("--trace-kinds", default="mlp")
    ap.add_argument("--eap-steps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)  # internal: run one method, write JSON here
    args = ap.parse_args()
    if args.child:
        return child(args)

    from capinterp.core.example import Example
    from capinterp.core.settings import resolve_dtype, set_threads
    from capinterp.core.tokens import Encoded
    from capinterp.kernels.ig import ig_scores
    from capinterp.kernels.ig_config import IGConfig

    set_threads(args.threads)
    dtype = resolve_dtype(args.dtype)
    model, t_build, _ = timed(lambda: build(args.config, args.device, dtype), args.device)
    c, L = PRESETS[args.config], PRESETS[args.config]["num_hidden_layers"]
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 500, (args.seq + 1,), generator=g).tolist()  # ids the stand-in tokenizer knows
    item = Encoded(ids[:-1], ids[-1:], Example("x", "y"))
    print(
        f"config {args.config}: {L} layers x {c['intermediate_size']} neurons, vocab {c['vocab_size']}, "
        f"{sum(p.numel() for p in model.original_model.parameters()) / 1e9:.2f}B params, {args.dtype} on "
        f"{args.device} ({torch.get_num_threads()} threads), prompt {args.seq}+1 tokens, m={args.steps}; built in {t_build:.0f}s"
    )

    from torch.utils.flop_counter import FlopCounterMode

    ig_scores(
        model, item, IGConfig(steps=1, batch_size=args.batch_size, route="fast")
    )  # the route's once-per-model check
    counts = []
    for m in (1, 2):
        with FlopCounterMode(display=False) as fc:
            ig_scores(model, item, IGConfig(steps=m, batch_size=args.batch_size, route="fast"))
        counts.append(fc.get_total_flops())
    measured = counts[0] + (counts[1] - counts[0]) * (args.steps - 1)
    elem = torch.finfo(dtype).bits // 8
    pred = ig_cost(c, args.seq, args.steps, batch_rows=args.batch_size, elem=elem)
    print(
        f"fast IG FLOPs per prompt: counted {measured / 1e12:.3f} T, cost model {pred['flops'] / 1e12:.3f} T "
        f"(ratio {measured / pred['flops']:.3f}); weight traffic (model) {pred['weight_bytes'] / 1e9:.1f} GB"
    )

    results: dict[str, tuple[float, float]] = {}
    scores: dict[str, torch.Tensor] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.methods.split(","):
            out = Path(tmp) / f"{name}.json"
            done = subprocess.run(_child_argv(sys.argv[1:], name, out), capture_output=True, text=True)
            if done.returncode != 0:
                last = done.stderr.strip().splitlines()[-1:] or [f"exit {done.returncode}"]
                print(f"{name:7s} FAILED: {last[0]}")
                continue
            r = json.loads(out.read_text())
            results[name] = (r["seconds"], r["peak"])
            if Path(tmp, f"{name}.pt").exists():
                scores[name] = torch.load(Path(tmp, f"{name}.pt"))
            part = r["part"]
            if name == "loop" and "ig" in scores:
                a, b = scores["ig"][:, :part], scores["loop"][:, :part]
                print(f"  fast vs loop: max rel diff {float((a - b).abs().max() / b.abs().max()):.2e}")
            note = f" (measured {part} of {L} layers, scaled)" if part < L else ""
            print(f"{name:7s} {r['seconds']:9.2f} s/prompt  peak {r['peak']:6.2f} GiB{note}", flush=True)
    same = {k: v for k, v in results.items() if k in ("loop", "captum")}  # the same scores, other routes
    if "ig" in results and same:
        base = results["ig"][0]
        print("ratios to fast IG: " + ", ".join(f"{k} {v[0] / base:.1f}x" for k, v in same.items()))
    for name in ("llama2-7b", "llama3-8b"):
        p = ig_cost(PRESETS[name], args.seq, args.steps, batch_rows=args.batch_size, elem=2)
        print(
            f"cost model, {name} bf16: fast IG {p['flops'] / 1e12:.1f} TFLOPs and {p['weight_bytes'] / 1e9:.0f} GB "
            f"of weight reads per prompt (not measured on a GPU)"
        )


def _child_argv(argv: list[str], name: str, out: Path) -> list[str]:
    """This command line for one method in a child process (``--methods name --child out``)."""
    keep, skip = [], False
    for a in argv:
        if skip or a.startswith("--methods="):
            skip = False
            continue
        if a == "--methods":
            skip = True
            continue
        keep.append(a)
    return [sys.executable, __file__, *keep, "--methods", name, "--child", str(out)]


def child(args) -> None:
    """One method in this process: time it, record the peak, write JSON (and IG scores) to ``--child``."""
    from capinterp.core.example import Example
    from capinterp.core.settings import resolve_dtype, set_threads
    from capinterp.core.tokens import Encoded
    from capinterp.kernels.ig import ig_scores
    from capinterp.kernels.ig_config import IGConfig
    from capinterp.localizers.dcsn import per_sample_scores

    set_threads(args.threads)
    name = args.methods
    model = build(args.config, args.device, resolve_dtype(args.dtype))
    L = PRESETS[args.config]["num_hidden_layers"]
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 500, (args.seq + 1,), generator=g).tolist()  # the parent's prompt
    item = Encoded(ids[:-1], ids[-1:], Example("x", "y"))
    runs = {
        "ig": lambda: ig_scores(model, item, IGConfig(steps=args.steps, batch_size=args.batch_size, route="fast")),
        "loop": lambda: ig_scores(
            model,
            item,
            IGConfig(steps=args.steps, batch_size=args.steps, route="loop"),
            layers=range(args.loop_layers or L),
        ),
        "captum": lambda: captum_ig(model, item, args.steps, list(range(args.captum_layers))),
        "dcsn": lambda: per_sample_scores(model, [item]),
        "trace": lambda: trace(model, args),
        "eap": lambda: eap(model, args),
    }
    out, secs, peak = timed(runs[name], args.device)
    part = {"captum": args.captum_layers, "loop": args.loop_layers or L}.get(name, L)
    if name in ("ig", "loop"):
        torch.save(out, Path(args.child).with_suffix(".pt"))
    Path(args.child).write_text(json.dumps({"seconds": secs * L / part, "peak": peak, "part": part}))


def eap(model, args):
    from capinterp.core.example import Example
    from capinterp.localizers.knowledge_circuit import KnowledgeCircuit

    fact = Example("The Eiffel Tower is located in the city of", " Paris", {"subject": "Eiffel Tower"})
    kc = KnowledgeCircuit(model, algorithm="eap-ig", steps=args.eap_steps, top_n=100, batch_size=1, progress=False)
    return kc.fit([fact])


def trace(model, args):
    from capinterp.core.example import Example
    from capinterp.localizers.causal_trace import CausalTrace

    fact = Example("The Eiffel Tower is located in the city of", "", {"subject": "Eiffel Tower"})
    return CausalTrace(model, samples=10, kinds=tuple(args.trace_kinds.split(",")), progress=False).fit([fact])


if __name__ == "__main__":
    main()
