"""The ``capinterp`` command line: ``info``, ``evaluate``, ``localize``, ``reproduce`` and ``main``
(the README job). Every command prints its result as JSON on stdout (logs and progress bars go to
stderr); the options and their checks are in :mod:`capinterp.app.args`."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from capinterp.app.args import build_parser, check_args
from capinterp.app.outdir import FolderInUse, hold

__all__ = ["COMMANDS", "cmd_evaluate", "cmd_info", "cmd_localize", "cmd_main", "cmd_reproduce", "main"]


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _load(args):
    from capinterp.core.model import load_model

    t = time.time()
    model = load_model(args.model, device=args.device, threads=args.threads)
    _say(f"loaded {model.capinterp_name} in {time.time() - t:.1f}s")
    return model


def _emit(result: dict) -> None:
    """The command's result: one JSON object on stdout (rank 0 only under torchrun)."""
    from capinterp.core import distributed as dist

    if dist.is_main():
        print(json.dumps(result, default=str))


def cmd_info(args) -> int:
    """``capinterp info``: the model's metadata and neuron hooks, as JSON on stdout (a table on stderr)."""
    from capinterp.core.model import model_meta, neuron_hook, valid_neurons

    model = _load(args)
    meta = model_meta(model)
    cfg = model.cfg
    kv = getattr(cfg, "n_key_value_heads", None) or cfg.n_heads
    info = {
        "model": meta["model"],
        "model_fingerprint": meta["model_fingerprint"],
        "n_layers": cfg.n_layers,
        "d_model": cfg.d_model,
        "d_mlp": cfg.d_mlp,
        "n_neurons": int(valid_neurons(model).sum()),  # padding of narrower layers is no neuron
        "n_heads": cfg.n_heads,
        "n_kv_heads": kv,
        "d_vocab": cfg.d_vocab,
        "n_params": meta["n_params"],
        "params_per_neuron": meta["params_per_neuron"],
        "neuron_hooks": [neuron_hook(layer) for layer in range(cfg.n_layers)],
        **({"layer_widths": meta["layer_widths"]} if "layer_widths" in meta else {}),
    }
    _say(
        f"model        {info['model']}  (fingerprint {info['model_fingerprint']})\n"
        f"layers       {cfg.n_layers}\nd_model      {cfg.d_model}\n"
        f"d_mlp        {cfg.d_mlp}  (neurons: {info['n_neurons']})\n"
        f"heads        {cfg.n_heads}  (kv heads: {kv})\nvocab        {cfg.d_vocab}\n"
        f"parameters   {meta['n_params']:,}  ({meta['params_per_neuron']} per neuron)\n"
        f"neuron hooks {neuron_hook(0)} .. {neuron_hook(cfg.n_layers - 1)}"
    )
    _emit(info)
    return 0


def _data_echo(args) -> dict:
    return {"ops": args.ops, "fmt": args.fmt, "lang": args.lang, "style": args.style}


def cmd_evaluate(args) -> int:
    """``capinterp evaluate``: accuracy and mean target probability on generated arithmetic, one JSON line."""
    from capinterp.kernels.evaluate import evaluate

    model = _load(args)
    res = evaluate(model, args.dataset, batch_size=args.batch_size, progress=True)
    _emit({**_data_echo(args), **res.to_dict()})
    return 0


def cmd_localize(args) -> int:
    """``capinterp localize``: fit a neuron localizer (``unit_kind == "neuron"``) on generated arithmetic
    (by default only the examples the model answers correctly); write its scores, neurons and heatmap
    under ``--out`` (a checkpoint named by the computation's key too when the class is ``checkpointable``)."""
    from capinterp.app.main_job import choose_examples
    from capinterp.localizers import available, get
    from capinterp.plots.html import write_html

    cls = get(args.method)
    if cls.unit_kind != "neuron":
        raise ValueError(
            f"'capinterp localize' runs neuron localizers ({', '.join(available(unit_kind='neuron'))}), "
            f"not {args.method!r} (its units are {cls.unit_kind}s)"
        )
    with hold(args.out) as out:
        model = _load(args)
        eval_batch = args.batch_size if isinstance(args.batch_size, int) else 16
        examples, used = choose_examples(model, args.dataset, args.examples, eval_batch)
        _say(f"localizing on {used['used']} of {used['total']} examples ({args.examples}; {used['dropped']} dropped)")
        extra: dict[str, Any] = {"checkpoint": out / f"{cls.name}-{{key}}.ckpt"} if cls.checkpointable else {}
        loc = cls(model, batch_size=args.batch_size, **extra).fit(examples)
        from capinterp.core import distributed as dist

        if not dist.is_main():  # under torchrun every rank holds the merged result; rank 0 writes it
            return 0
        name = cls.name
        loc.scores_.save(out / f"{name}_scores.capi")
        loc.neurons_.save(out / f"{name}_neurons.capi")
        fig = loc.scores_.plot(title=f"{name.upper()} scores, ops {args.ops}")
        heatmap = write_html(fig, out / f"{name}_heatmap.html", plotlyjs=args.plotlyjs)
        result = {
            "method": name,
            "neurons": len(loc.neurons_),
            "ratio": loc.neurons_.ratio,
            "examples": used,
            "out": str(out),
            "heatmap": str(heatmap),
            "checkpoint": getattr(loc, "checkpoint_path_", None),
        }
        check = getattr(loc, "meta_", {}).get("ig_check")
        if check and check.get("completeness_max"):  # IG-based: per layer, max over examples
            result["completeness_max"] = check["completeness_max"]
        _emit(result)
    return 0


def cmd_main(args) -> int:
    """The README job: default model, arithmetic data, evaluation, CNL localization, heatmap."""
    from capinterp.app.main_job import run_main

    with hold(args.out):
        return run_main(args)


def cmd_reproduce(args) -> int:
    """Every experiment (or ``--only``), resumable, into ``--out``: report.html, results.json; a JSON
    summary (each experiment's status and seconds) on stdout."""
    from capinterp.app.reproduce import reproduce
    from capinterp.experiments import EXPERIMENTS

    if args.list:
        _emit({name: title for name, (title, _) in EXPERIMENTS.items()})
        return 0
    only = None if args.only is None else [s.strip() for s in args.only.split(",") if s.strip()]
    if only is not None:
        unknown = [n for n in only if n not in EXPERIMENTS]
        if unknown:  # before the model loads
            raise ValueError(f"unknown experiment(s) {unknown}; available: {', '.join(EXPERIMENTS)}")
    if args.data is not None:
        if not Path(args.data).is_dir():
            raise ValueError(f"--data {args.data!r} is not a folder")
        os.environ["CAPINTERP_DATA"] = str(Path(args.data).resolve())
    with hold(args.out) as out:
        model = _load(args)
        res = reproduce(
            model,
            out,
            quick=args.quick,
            only=only,
            seed=args.seed,
            batch_size=args.batch_size,
            fresh=args.fresh,
            progress=args.progress,
            log=_say,
            ig_rule=args.ig_rule,
            plotlyjs=args.plotlyjs,
        )
    failed = [n for n, e in res["experiments"].items() if "error" in e]
    from capinterp.core import distributed as dist

    if not dist.is_main():  # rank 0 wrote and reports
        return 1 if failed else 0
    _say(f"report: {out / 'report.html'}" + (f"; FAILED: {', '.join(failed)}" if failed else ""))
    experiments = {
        n: {
            "status": "failed"
            if "error" in e
            else "skipped"
            if "skipped" in e
            else ("loaded" if e.get("resumed") else "ran"),
            "seconds": e.get("seconds"),
        }
        | ({"error": e["error"]} if "error" in e else {})
        | ({"skipped": e["skipped"]} if "skipped" in e else {})
        for n, e in res["experiments"].items()
    }
    _emit(
        {
            "out": str(out),
            "report": str(out / "report.html"),
            "results": str(out / "results.json"),
            "experiments": experiments,
            "failed": failed,
        }
    )
    return 1 if failed else 0


#: The function that runs each subcommand.
COMMANDS = {
    "info": cmd_info,
    "evaluate": cmd_evaluate,
    "localize": cmd_localize,
    "reproduce": cmd_reproduce,
    "main": cmd_main,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line on ``argv``; returns the exit status (2 with a one-line message on bad input
    or an output folder in use)."""
    args = build_parser(__doc__).parse_args(argv)
    try:
        if not getattr(args, "list", False):
            check_args(args)
        return int(COMMANDS[args.command](args) or 0)
    except (ValueError, TypeError, FileNotFoundError, FolderInUse) as err:
        print(f"capinterp: error: {err}", file=sys.stderr)
        return 2
    finally:
        from capinterp.core import distributed as dist

        dist.finish()  # leave the torchrun process group, if this command joined one


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
