"""The README's main job: on the default model, evaluate arithmetic, localize CNL neurons for one
operator, write the heatmap, check by erasure, and write the cards of the top neurons."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from capinterp import data
from capinterp.app.args import data_kwargs
from capinterp.arch.family import family_of
from capinterp.arch.model import load_model
from capinterp.core.atomic import write_atomic
from capinterp.core.protocol import Model
from capinterp.interventions.hooks import erase
from capinterp.kernels.evaluate import EvalResult, evaluate
from capinterp.localizers import cost
from capinterp.localizers.cnl import CNL
from capinterp.plots.html import write_html

EXAMPLES = ("correct", "all")

__all__ = ["run_main"]


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def choose_examples(
    model: Model, ds: list, mode: str, batch_size: int, base: EvalResult | None = None
) -> tuple[list, dict[str, Any]]:
    """The examples to localize on and how many were used: ``mode="correct"`` keeps those the model
    answers correctly (evaluating them unless ``base`` is given), ``"all"`` keeps every one.
    ValueError when ``"correct"`` leaves none."""
    if mode not in EXAMPLES:
        raise ValueError(f"examples must be one of {EXAMPLES}, got {mode!r}")
    if mode == "all":
        kept = list(ds)
    else:
        base = base if base is not None else evaluate(model, ds, batch_size=batch_size)
        kept = [e for e, r in zip(ds, base.records) if r["correct"]]
        if not kept:
            raise ValueError(
                f"the model answers none of the {len(ds)} examples correctly, so '--examples correct' leaves "
                "nothing to localize on; pass '--examples all', or easier data (--ops, --digits, --style)"
            )
    return kept, {"mode": mode, "total": len(ds), "used": len(kept), "dropped": len(ds) - len(kept)}


def _random_baseline(model: Model, ds: list, neurons, seed: int, n_sets: int, batch_size: int) -> list[EvalResult]:
    """Evaluate ``ds`` with ``n_sets`` random neuron sets of ``neurons``'s size erased (seeds ``seed``,
    ``seed + 1``, ...): the spread a located set must be compared with."""
    out = []
    for k in range(n_sets):
        with erase(model, neurons.random_like(seed=seed + k)):
            out.append(evaluate(model, ds, batch_size=batch_size))
    return out


def run_main(args) -> int:
    """The README job (``capinterp main``): evaluate, localize CNL neurons (on the examples chosen by
    ``args.examples``), write the heatmap, erase them and, as the baseline, ``args.random_seeds``
    random sets of the same size, evaluating each; returns the exit status. stdout gets one JSON
    document (the summary, also in ``summary.json``); every log line goes to stderr."""
    from capinterp.app import notes
    from capinterp.app.args import ig_kwargs

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    ig = ig_kwargs(args, CNL)  # checked before the model loads
    n_random = int(getattr(args, "random_seeds", 1) or 1)
    t0 = time.time()
    model = load_model(args.model, device=args.device, threads=args.threads)
    widths = family_of(model).layer_widths  # layers of differing width: count the real neurons, not padding
    shape = f"{sum(widths)} neurons in layers of {list(widths)}" if widths else f"x {model.cfg.d_mlp} neurons"
    _say(f"[1/5] loaded {model.capinterp_name}: {model.cfg.n_layers} layers {shape} ({time.time() - t0:.0f}s)")

    ds = getattr(args, "dataset", None) or data.arithmetic(**data_kwargs(args))
    _say(f"[2/5] data: {data.describe(ds)}; example: {ds[0].prompt!r} -> {ds[0].target!r}")

    base = evaluate(model, ds, batch_size=args.batch_size)
    _say(f"[3/5] evaluate: {base}")

    # By default localize on the examples the model gets right: the capability it actually has.
    used, counts = choose_examples(model, ds, args.examples, args.batch_size, base)
    before = notes.checkpoint_counts(out)
    cnl = CNL(model, batch_size=args.batch_size * 4, checkpoint=out / "cnl-{key}.ckpt", **ig)
    _say(f"      CNL {cost.estimate_line(cnl, used)}")  # before the long part: seconds and memory
    cnl.fit(used)
    neurons = cnl.neurons_
    cnl.scores_.save(out / "cnl_scores.capi")
    neurons.save(out / "cnl_neurons.capi")
    title = f"CNL scores, ops {args.ops!r}, {model.capinterp_name} ({len(neurons)} neurons at sigma={cnl.sigma:g})"
    fig = cnl.scores_.plot(title=title, selected=neurons)  # the located neurons ringed
    heatmap = write_html(fig, out / "cnl_heatmap.html", plotlyjs=args.plotlyjs)
    _say(
        f"[4/5] CNL on {counts['used']} of {counts['total']} examples ({args.examples}): {len(neurons)} neurons "
        f"({100 * neurons.ratio:.3f}% of FFN neurons) -> {heatmap}"
    )
    ckpt = notes.resume_info(before, cnl.checkpoint_path_, counts["used"])
    resumed = notes.resume_line(ckpt)
    if resumed:
        _say("      " + resumed)
    completeness = notes.completeness_info(cnl.meta_)
    if completeness:
        _say("      " + completeness[1])

    with erase(model, neurons):
        erased = evaluate(model, ds, batch_size=args.batch_size)
    randoms = _random_baseline(model, ds, neurons, args.seed, n_random, args.batch_size)
    accs = [r.accuracy for r in randoms]
    note = notes.random_baseline_note(
        (base.accuracy, base.mean_prob),
        (erased.accuracy, erased.mean_prob),
        [(r.accuracy, r.mean_prob) for r in randoms],
        len(neurons),
    )
    _say(f"[5/5] erase located: {erased}\n      erase random (same size, {n_random} seed(s)): accuracy {accs}")
    _say("      " + note)
    cards = main_cards(model, cnl, used, out, int(getattr(args, "cards", 0) or 0), args.batch_size)
    if cards is not None:
        _say(f"      cards of the top {cards['n']} CNL neurons ({cards['seconds']:.0f}s) -> {cards['page']}")

    summary: dict[str, Any] = {
        "model": model.capinterp_name,
        "data": data.describe(ds),
        "accuracy": base.accuracy,
        "mean_prob": base.mean_prob,
        "examples": counts,
        "cnl_neurons": len(neurons),
        "cnl_ratio": neurons.ratio,
        "erase_located": erased.to_dict(),
        "erase_random": randoms[0].to_dict(),
        "erase_random_seeds": {
            "seeds": [args.seed + k for k in range(n_random)],
            "accuracy": accs,
            "mean_prob": [r.mean_prob for r in randoms],
            "accuracy_min": min(accs),
            "accuracy_max": max(accs),
        },
        "note": note,
        "seconds": round(time.time() - t0, 1),
        "heatmap": str(heatmap),
        "checkpoint": cnl.checkpoint_path_,
        "checkpoint_info": ckpt,
    }
    if completeness:
        summary["completeness"] = completeness[0]
    if cards is not None:
        summary["cards"] = cards
    write_atomic(out / "summary.json", json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2), flush=True)
    _say(next_steps(heatmap, out, args.model, cards["page"] if cards else None))
    return 0


#: The main job's cards corpus: the task's prompts plus this many texts (the data folder's local text, or
#: the built-in text), each cut to ``CARDS_MAX_TOKENS`` tokens, and this many neurons ablated one at a time.
CARDS_TEXTS, CARDS_MAX_TOKENS, CARDS_ABLATE = 100, 64, 2


def main_cards(model: Model, cnl: CNL, examples: list, out: Path, n: int, batch_size: int) -> dict[str, Any] | None:
    """``main --cards N``: the cards page of the top ``n`` located CNL neurons (``out/cnl_cards.html``
    and ``.json``), over the task's prompts and a small corpus (:data:`CARDS_TEXTS`), the task being
    the localization ``examples``; None when ``n`` is 0 or CNL located no neuron."""
    from capinterp.app.describe_cmd import write_cards
    from capinterp.cards import describe
    from capinterp.cards.inputs import builtin_texts
    from capinterp.data.corpus import local_texts

    if n <= 0 or not len(cnl.neurons_):
        return None
    t0 = time.time()
    try:
        extra = local_texts(n=CARDS_TEXTS)
    except (FileNotFoundError, ValueError):
        extra = builtin_texts()[:CARDS_TEXTS]
    texts = [e.prompt for e in examples] + extra
    cards = describe(
        model,
        cnl,
        texts,
        task=examples,
        top=n,
        ablate=min(n, CARDS_ABLATE),
        batch_size=batch_size,
        max_tokens=CARDS_MAX_TOKENS,
        progress=False,
    )
    return {"n": len(cards), **write_cards(cards, out, "cnl_cards"), "seconds": round(time.time() - t0, 1)}


def next_steps(heatmap: Path, out: Path, model: str | None, cards: str | None = None) -> str:
    """What to open and run after the main job (stderr)."""
    flag = f" --model {model}" if model else ""
    page = f"  open {cards} in a browser: what the top CNL neurons do (one card per neuron)\n" if cards else ""
    return (
        "next:\n"
        f"  open {heatmap} in a browser: CNL's score per neuron (layer x neuron)\n"
        + page
        + f"  {out / 'summary.json'} holds this result; the .ckpt file beside it lets a rerun resume (delete it to start over)\n"
        f"  locate on your own facts: capinterp localize{flag} --data facts.csv --method kn "
        "(a CSV with prompt,target[,subject] columns; --method causal_trace or knowledge_circuit need subject)\n"
        f"  or the package's own facts: capinterp localize{flag} --data builtin --n 3 --method causal_trace "
        "(causal tracing is the slowest method: start with a few facts)"
    )
