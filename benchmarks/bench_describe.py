"""Tokens per second of :func:`capinterp.cards.contexts.top_contexts` against a plain forward pass.

    CAPINTERP_DATA=/path/to/data .venv/bin/python benchmarks/bench_describe.py --model smollm2 --tokens 20000

``top_contexts`` for ``--neurons`` random neurons (seeded, over all layers) over texts holding about
``--tokens`` tokens (the data folder's texts, :func:`capinterp.data.corpus.local_texts`; generated
arithmetic prompts where no data folder is found), each cut at ``--max-tokens``, against the floor:
a plain forward pass over the same batches (same texts, same order, same padding) with one hook on
one layer's neurons. Also shown: the same forward stopped at the last layer the neurons use, as
``top_contexts`` stops (SmolLM2 and Gemma 3 skip the unembedding then). Runs alternate (floor,
stopped floor, top_contexts) ``--repeats`` times after one warm-up each; the table gives the median
seconds, tokens/s and the ratio to the floor.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch
from _roofline import Dims, forward_flops, model_matmul_gflops

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import capinterp as ci
from capinterp.arch.forward import capture
from capinterp.arch.model import neuron_hook
from capinterp.cards._act_stream import batches_of, encode_texts
from capinterp.cards.contexts import top_contexts
from capinterp.core.tokens import pad_id, pad_right


def corpus(model, n_tokens: int, max_tokens: int) -> list[str]:
    """Texts adding up to about ``n_tokens`` tokens (each counted up to ``max_tokens``)."""
    try:
        from capinterp.data.corpus import local_texts

        pool = local_texts(n=100000)
        source = "local_texts"
    except (FileNotFoundError, ValueError):
        pool = [f"Question: what is {a} + {b}? Answer: {a + b}." for a in range(100) for b in range(100)]
        source = "arithmetic prompts"
    out, total = [], 0
    for text in pool:
        if total >= n_tokens:
            break
        out.append(text)
        total += min(max_tokens, len(model.tokenizer(text, add_special_tokens=False)["input_ids"]))
    print(f"corpus: {len(out)} texts, {total} tokens ({source})", flush=True)
    return out


def floor(model, ids: list[list[int]], batch_size: int, layer: int, stop: bool) -> None:
    """The same batches through the model with one hook reading one layer's neurons."""
    pad = pad_id(model.tokenizer)
    seen = []
    for group in batches_of(ids, batch_size):
        tokens, _ = pad_right([ids[i] for i in group], pad)
        tokens = tokens.to(model.cfg.device)
        with torch.no_grad():
            if stop:
                seen.append(capture(model, tokens, neuron_hook(layer))[..., 0].sum())
            else:
                model.run_with_hooks(
                    tokens, fwd_hooks=[(neuron_hook(layer), lambda x, hook: seen.append(x[..., 0].sum()))]
                )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2")
    p.add_argument("--tokens", type=int, default=20000)
    p.add_argument("--neurons", type=int, default=200)
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--device", default=None)
    args = p.parse_args()
    model = ci.load_model(args.model, threads=args.threads, device=args.device)
    texts = corpus(model, args.tokens, args.max_tokens)
    ids = encode_texts(model, texts, args.max_tokens)
    n_tok = sum(map(len, ids))
    L, D = int(model.cfg.n_layers), int(model.cfg.d_mlp)
    g = torch.Generator().manual_seed(0)
    flat = torch.randperm(L * D, generator=g)[: args.neurons]
    units = sorted((int(i) // D, int(i) % D) for i in flat)
    last = max(u[0] for u in units)
    runs = {
        "floor: forward + 1 hook": lambda: floor(model, ids, args.batch_size, last, stop=False),
        f"floor stopped at layer {last}": lambda: floor(model, ids, args.batch_size, last, stop=True),
        f"top_contexts ({args.neurons} neurons, k={args.k})": lambda: top_contexts(
            model, units, texts, k=args.k, batch_size=args.batch_size, max_tokens=args.max_tokens, progress=False
        ),
    }
    times: dict[str, list[float]] = {name: [] for name in runs}
    for rep in range(args.repeats + 1):  # the first round warms up
        for name, run in runs.items():
            t0 = time.perf_counter()
            run()
            if rep:
                times[name].append(time.perf_counter() - t0)
    print(
        f"model {args.model}, device {model.cfg.device}, {n_tok} tokens, batch {args.batch_size}, "
        f"threads {args.threads}, median of {args.repeats}"
    )
    base = statistics.median(times["floor: forward + 1 hook"])
    # useful FLOPs per padded batch: the full forward (unembedding too) for the floor, blocks 0..last for the others
    d, groups = Dims.of(model), [[len(ids[i]) for i in g] for g in batches_of(ids, args.batch_size)]
    full = sum(forward_flops(d, max(g), rows=len(g)) for g in groups)
    stopped = sum(forward_flops(d, max(g), rows=len(g), last=last, unembed=0) for g in groups)
    peak = model_matmul_gflops(model, args.threads)  # same threads, dtype and device, this run
    print(f"matmul at the model's FFN shape: {peak:.2f} GFLOP/s")
    print(f"{'run':<40} {'seconds':>8} {'tokens/s':>9} {'x floor':>8} {'GFLOP/s':>8} {'% matmul':>8}")
    for name, ts in times.items():
        s, f = statistics.median(ts), full if name.startswith("floor:") else stopped
        print(
            f"{name:<40} {s:8.2f} {n_tok / s:9.0f} {s / base:8.2f} {f / s / 1e9:8.2f} {100 * f / s / 1e9 / peak:7.1f}%"
        )


if __name__ == "__main__":
    main()
