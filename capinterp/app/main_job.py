"""The README's main job: on the embedded default model, generate arithmetic data, evaluate it,
localize CNL capability neurons for one operator, write the heatmap, and check by erasure."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from capinterp import data
from capinterp.core.model import load_model
from capinterp.interventions.hooks import erase
from capinterp.kernels.evaluate import evaluate
from capinterp.localizers.cnl import CNL

__all__ = ["run_main"]


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run_main(args) -> int:
    """The README job (``capinterp main``): evaluate, localize CNL neurons, write the heatmap, erase them and
    evaluate again; returns the exit status."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    model = load_model(args.model, device=args.device, threads=args.threads)
    _say(
        f"[1/5] loaded {model.capinterp_name}: {model.cfg.n_layers} layers x {model.cfg.d_mlp} neurons ({time.time() - t0:.0f}s)"
    )

    ds = data.arithmetic(ops=args.ops, n=args.n, fmt=args.fmt, lang=args.lang, digits=args.digits, seed=args.seed)
    _say(f"[2/5] data: {data.describe(ds)}; example: {ds[0].prompt!r} -> {ds[0].target!r}")

    base = evaluate(model, ds, batch_size=args.batch_size)
    _say(f"[3/5] evaluate: {base}")

    # Localize on the examples the model gets right: the capability it actually has.
    right = [e for e, r in zip(ds, base.records) if r["correct"]] or ds
    cnl = CNL(model, batch_size=args.batch_size * 4, checkpoint=out / "cnl.ckpt").fit(right)
    neurons = cnl.neurons_
    cnl.scores_.save(out / "cnl_scores.capi")
    neurons.save(out / "cnl_neurons.capi")
    title = f"CNL scores, ops {args.ops!r}, {model.capinterp_name} ({len(neurons)} neurons at sigma={cnl.sigma:g})"
    cnl.scores_.plot(title=title).write_html(out / "cnl_heatmap.html")
    _say(f"[4/5] CNL: {len(neurons)} neurons ({100 * neurons.ratio:.3f}% of FFN neurons) -> {out / 'cnl_heatmap.html'}")

    with erase(model, neurons):
        erased = evaluate(model, ds, batch_size=args.batch_size)
    with erase(model, neurons.random_like(seed=args.seed)):
        random = evaluate(model, ds, batch_size=args.batch_size)
    _say(f"[5/5] erase located: {erased}\n      erase random (same size): {random}")

    summary = {
        "model": model.capinterp_name,
        "data": data.describe(ds),
        "accuracy": base.accuracy,
        "mean_prob": base.mean_prob,
        "cnl_neurons": len(neurons),
        "cnl_ratio": neurons.ratio,
        "erase_located": erased.to_dict(),
        "erase_random": random.to_dict(),
        "seconds": round(time.time() - t0, 1),
        "heatmap": str(out / "cnl_heatmap.html"),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2))
    return 0
