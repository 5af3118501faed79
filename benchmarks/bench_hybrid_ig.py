"""IG's fast route where the prompt prefix leaves a state of its own, against the loop route.

    .venv/bin/python benchmarks/bench_hybrid_ig.py --threads 2
    .venv/bin/python benchmarks/bench_hybrid_ig.py --families bamba,lfm2 --n 2 --layers 8 --width 128

On a hybrid (Mamba, linear-attention, short-convolution layers) and on DeepSeek-V4 (compressed
attention) the fast route continues every row from a copy of the prompt prefix's cache (recurrent
and convolution states, compressed blocks, keys and values) and runs only the scaled positions
through the layers from the row's own up; the loop route runs every row over the whole sequence. Tiny random models of each family (``capinterp.arch.tiny.tiny_hf``, widened with
``--width`` / deepened with ``--layers`` where given), the few-shot arithmetic prompts of
``bench_ig.py`` (about 30 tokens), steps 20, all layers, KN's position (the last prompt token). Both
routes run in one process, interleaved prompt by prompt; printed per family: seconds per prompt of
each, their ratio, and the largest difference of the scores relative to the largest score.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from bench_ig import make_prompts

from capinterp.arch.family import UnsupportedFamily
from capinterp.arch.model import load_model
from capinterp.arch.tiny import TINY_FAMILIES, tiny_hf
from capinterp.core.tokens import encode
from capinterp.kernels.ig import ig_scores
from capinterp.kernels.ig_config import IGConfig

FAMILIES = "qwen3_next,bamba,jamba,falcon_h1,lfm2,granitemoehybrid,nemotron_h,deepseek_v4"


def _model(family: str, layers: int | None, width: int | None):
    over: dict = {}
    if width:
        over["hidden_size"] = width
    if layers:  # repeat the tiny model's own layer pattern
        base = TINY_FAMILIES[family]
        for key in ("layer_types", "layers_block_type", "mlp_layer_types"):
            if isinstance(base.get(key), list):
                over[key] = (base[key] * layers)[:layers]
        over["num_hidden_layers"] = layers
    hf, tok = tiny_hf(family, **over)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load_model(hf, tokenizer=tok)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--families", default=FAMILIES)
    ap.add_argument("--n", type=int, default=3, help="prompts per family")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--layers", type=int, default=None, help="layers (the tiny model's pattern repeated)")
    ap.add_argument("--width", type=int, default=None, help="hidden size")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    cfg = IGConfig(steps=args.steps, positions="last_prompt")
    print(f"torch threads {torch.get_num_threads()}, steps {args.steps}, {args.n} prompts per family")
    for family in args.families.split(","):
        try:
            model = _model(family, args.layers, args.width)
        except UnsupportedFamily as err:  # a width the tiny config's other sizes do not fit
            print(f"{family:18s} not built at these sizes: {err}")
            continue
        encs = encode(model, make_prompts(args.n))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # completeness at steps 20 on random weights
            ig_scores(model, encs[0], cfg)  # warm-up, and the route's check
            ig_scores(model, encs[0], cfg.replace(route="loop"))
            t_fast = t_loop = err = 0.0
            for enc in encs:
                t = time.perf_counter()
                fast = ig_scores(model, enc, cfg)
                t_fast += time.perf_counter() - t
                t = time.perf_counter()
                loop = ig_scores(model, enc, cfg.replace(route="loop"))
                t_loop += time.perf_counter() - t
                err = max(err, float((fast - loop).abs().max() / loop.abs().max()))
        n_tok = sum(len(e.ids) for e in encs) / len(encs)
        print(
            f"{family:18s} {model.cfg.n_layers} layers x d_model {model.cfg.d_model}, {n_tok:.0f} tokens: "
            f"fast {t_fast / len(encs):.3f}s, loop {t_loop / len(encs):.3f}s per prompt, "
            f"loop / fast {t_loop / t_fast:.1f}x; max |fast - loop| / max |loop| {err:.1e}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
