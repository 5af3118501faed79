"""Benchmark sequential integrated gradients (SIG, as used by Chen et al. 2025, arXiv 2405.14117): the staircase route against the loop.

    python benchmarks/bench_sig.py --model gemma3 --n 2 --steps 5 --threads 1

Both routes score the same prompts (builtin paraphrases the model answers), interleaved prompt
by prompt so machine noise hits both alike: ``loop`` runs one full forward and backward per
(position, step) row of one layer; ``fast`` computes the prompt before the first scaled
position once and lets each row enter at its own block, so rows of several layers share a
batch (:mod:`capinterp.kernels.sequential`). Prints seconds per prompt for each, the speed-up,
and the largest difference between the routes relative to the largest score.
"""

from __future__ import annotations

import argparse
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--n", type=int, default=2, help="prompts")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default=None)
    args = ap.parse_args()

    from capinterp.arch.model import load_model
    from capinterp.core.tokens import encode
    from capinterp.data.paraphrases import builtin_paraphrases, known_paraphrases
    from capinterp.kernels.sequential import DEFAULT, sig_scores

    model = load_model(args.model, threads=args.threads, device=args.device)
    bags = known_paraphrases(model, builtin_paraphrases(None), per_fact=2, min_prompts=1, max_facts=args.n)
    prompts = [bag[0] for bag in bags][: args.n]
    if not prompts:
        raise SystemExit(f"{args.model} answers none of the builtin paraphrases")
    encs = encode(model, prompts, max_target_tokens=1)
    config = DEFAULT.replace(steps=args.steps, batch_size=args.batch_size)
    secs = {"loop": 0.0, "fast": 0.0}
    err = 0.0
    for enc in encs:
        got = {}
        for route in ("loop", "fast"):
            t0 = time.perf_counter()
            got[route] = sig_scores(model, enc, config.replace(route=route))
            secs[route] += time.perf_counter() - t0
        err = max(err, float((got["fast"] - got["loop"]).abs().max() / got["loop"].abs().max()))
    n_pos = sum(e.last_prompt_pos for e in encs) / len(encs)
    print(
        f"SIG on {args.model}: {len(encs)} prompts (mean {n_pos:.1f} scaled positions), {args.steps} steps, "
        f"batch {args.batch_size}, {args.threads} thread(s)"
    )
    for m in ("loop", "fast"):
        print(f"  {m:5s} {secs[m] / len(encs):8.2f} s/prompt")
    print(f"  speed-up fast/loop: {secs['loop'] / secs['fast']:.2f}x; max |fast - loop| / max|loop|: {err:.1e}")


if __name__ == "__main__":
    main()
