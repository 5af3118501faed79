"""The ``capinterp`` command line: ``info``, ``evaluate``, ``localize``, ``reproduce`` and ``main``
(the README job)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="gemma3 (default), smollm2, tiny, a folder, or a TL name")
    p.add_argument("--device", default=None, help="cpu (default), cuda, cuda:1, ...")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")


def _data_args(p: argparse.ArgumentParser, n: int = 100) -> None:
    p.add_argument("--ops", default="+", help="operators, e.g. '+' or '+-*/'")
    p.add_argument("--fmt", default="DG", choices=["DG", "MQ", "TF"])
    p.add_argument("--lang", default="en", choices=["en", "zh"])
    p.add_argument(
        "--n",
        "--n-examples",
        dest="n",
        type=int,
        default=n,
        help="number of examples (under torchrun write --n-examples: torchrun reads --n as its own)",
    )
    p.add_argument("--digits", type=int, default=1, help="operand digits")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=_batch_size, default=16, help="an integer, or 'auto' (localize)")


def _batch_size(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"batch size must be an integer or 'auto', got {text!r}") from None


def _int_batch(args) -> int:
    if args.batch_size == "auto":
        raise ValueError("--batch-size auto applies to 'capinterp localize' only; give an integer here")
    return args.batch_size


def _load(args):
    from capinterp.core.model import load_model

    t = time.time()
    model = load_model(args.model, device=args.device, threads=args.threads)
    print(f"loaded {model.capinterp_name} in {time.time() - t:.1f}s", file=sys.stderr)
    return model


def _dataset(args):
    from capinterp.data import arithmetic

    return arithmetic(ops=args.ops, n=args.n, fmt=args.fmt, lang=args.lang, digits=args.digits, seed=args.seed)


def cmd_info(args) -> int:
    """``capinterp info``: print the model's metadata and neuron hook as one JSON line."""
    from capinterp.core.model import model_meta, neuron_hook

    model = _load(args)
    meta = model_meta(model)
    cfg = model.cfg
    print(f"model        {meta['model']}  (fingerprint {meta['model_fingerprint']})")
    print(f"layers       {cfg.n_layers}")
    print(f"d_model      {cfg.d_model}")
    print(f"d_mlp        {cfg.d_mlp}  (neurons: {cfg.n_layers * cfg.d_mlp})")
    print(f"heads        {cfg.n_heads}  (kv heads: {getattr(cfg, 'n_key_value_heads', None) or cfg.n_heads})")
    print(f"vocab        {cfg.d_vocab}")
    print(f"parameters   {meta['n_params']:,}  ({meta['params_per_neuron']} per neuron)")
    print(f"neuron hooks {neuron_hook(0)} .. {neuron_hook(cfg.n_layers - 1)}")
    return 0


def cmd_evaluate(args) -> int:
    """``capinterp evaluate``: accuracy and mean target probability on generated arithmetic, one JSON line."""
    from capinterp.kernels.evaluate import evaluate

    ds = _dataset(args)
    model = _load(args)
    res = evaluate(model, ds, batch_size=_int_batch(args), progress=True)
    print(json.dumps({"ops": args.ops, "fmt": args.fmt, "lang": args.lang, **res.to_dict()}))
    return 0


def cmd_localize(args) -> int:
    """``capinterp localize``: fit a neuron localizer (``unit_kind == "neuron"``) on generated arithmetic; write its
    scores, neurons and heatmap under ``--out`` (a checkpoint too when the class is ``checkpointable``)."""
    from capinterp.localizers import available, get

    cls = get(args.method)
    if cls.unit_kind != "neuron":
        raise ValueError(
            f"'capinterp localize' runs neuron localizers ({', '.join(available(unit_kind='neuron'))}), "
            f"not {args.method!r} (its units are {cls.unit_kind}s)"
        )
    ds = _dataset(args)
    model = _load(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    extra = {"checkpoint": out / f"{cls.name}.ckpt"} if cls.checkpointable else {}
    loc = cls(model, batch_size=args.batch_size, **extra).fit(ds)
    from capinterp.core import distributed as dist

    if not dist.is_main():  # under torchrun every rank holds the merged result; rank 0 writes it
        return 0
    name = cls.name
    loc.scores_.save(out / f"{name}_scores.capi")
    loc.neurons_.save(out / f"{name}_neurons.capi")
    loc.scores_.plot(title=f"{name.upper()} scores, ops {args.ops}").write_html(out / f"{name}_heatmap.html")
    info = {"method": name, "neurons": len(loc.neurons_), "ratio": loc.neurons_.ratio, "out": str(out)}
    check = getattr(loc, "meta_", {}).get("ig_check")
    if check and check.get("completeness_max"):  # IG-based: per layer, max over examples
        info["completeness_max"] = check["completeness_max"]
    print(json.dumps(info))
    return 0


def cmd_main(args) -> int:
    """The README job: default model, arithmetic data, evaluation, CNL localization, heatmap."""
    from capinterp.app.main_job import run_main

    _int_batch(args)
    return run_main(args)


def cmd_reproduce(args) -> int:
    """Every experiment (or ``--only``), resumable, into ``--out``: report.html, results.json."""
    from capinterp.app.reproduce import reproduce
    from capinterp.experiments import EXPERIMENTS

    if args.list:
        for name, (title, _) in EXPERIMENTS.items():
            print(f"{name:20s} {title}")
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
    model = _load(args)
    say = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    res = reproduce(
        model,
        args.out,
        quick=args.quick,
        only=only,
        seed=args.seed,
        batch_size=args.batch_size,
        fresh=args.fresh,
        progress=args.progress,
        log=say,
        ig_rule=args.ig_rule,
    )
    failed = [n for n, e in res["experiments"].items() if "error" in e]
    from capinterp.core import distributed as dist

    if not dist.is_main():  # rank 0 wrote and reports
        return 1 if failed else 0
    say(f"report: {Path(args.out) / 'report.html'}" + (f"; FAILED: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand (``capinterp --help`` prints it)."""
    ap = argparse.ArgumentParser(prog="capinterp", description=__doc__)
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("info", help="model facts: layers, d_mlp, hook names")
    _common(p)
    p.set_defaults(func=cmd_info)
    p = sub.add_parser("evaluate", help="accuracy and target probability on generated arithmetic")
    _common(p)
    _data_args(p)
    p.set_defaults(func=cmd_evaluate)
    p = sub.add_parser("localize", help="run a localizer on generated arithmetic, save scores/neurons/heatmap")
    _common(p)
    _data_args(p)
    p.add_argument(
        "--method",
        default="cnl",
        help="neuron localizer by registry name (capinterp.localizers.available(unit_kind='neuron'))",
    )
    p.add_argument("--out", default="out")
    p.set_defaults(func=cmd_localize)
    p = sub.add_parser("reproduce", help="run the papers' experiments, write DIR/report.html and results.json")
    _common(p)
    p.add_argument("--quick", action="store_true", help="small subsets (about 10 minutes on a 2-core CPU)")
    p.add_argument("--out", default="reproduction", help="output folder; a rerun resumes there")
    p.add_argument("--only", default=None, help="comma-separated experiment names (see --list)")
    p.add_argument("--data", default=None, help="evaluation-data folder (sets CAPINTERP_DATA; default: that variable)")
    p.add_argument("--list", action="store_true", help="list the experiments and exit")
    p.add_argument("--fresh", action="store_true", help="delete --out first instead of resuming")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--progress", action="store_true", help="progress bars for localizer fits")
    p.add_argument(
        "--ig-rule",
        default="papers",
        choices=["papers", "accurate"],
        help="IG quadrature: the papers' right Riemann sum, or Gauss-Legendre (accurate)",
    )
    p.set_defaults(func=cmd_reproduce)
    p = sub.add_parser("main", help="the README job on the embedded default model")
    _common(p)
    _data_args(p, n=40)
    p.add_argument("--out", default="out")
    p.set_defaults(func=cmd_main)
    return ap


def check_args(args) -> None:
    """Every argument problem found before a model loads: a ValueError / TypeError naming it."""
    from capinterp.core import validate

    validate.device("--device", getattr(args, "device", None))
    for flag in ("threads", "n", "digits", "batch_size"):
        value = getattr(args, flag, None)
        if value is not None and value != "auto":
            validate.positive_int("--" + flag.replace("_", "-"), value)
    if getattr(args, "only", None) is not None and not [s for s in args.only.split(",") if s.strip()]:
        raise ValueError(f"--only {args.only!r} names no experiment; omit --only to run them all (see --list)")
    out = getattr(args, "out", None)
    if out is not None and Path(out).exists() and not Path(out).is_dir():
        raise ValueError(f"--out {out!r} is an existing file, not a folder; choose a folder path")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line on ``argv``; returns the exit status (2 with a one-line message on bad input)."""
    args = build_parser().parse_args(argv)
    try:
        if not getattr(args, "list", False):
            check_args(args)
        return int(args.func(args) or 0)
    except (ValueError, TypeError, FileNotFoundError) as err:
        print(f"capinterp: error: {err}", file=sys.stderr)
        return 2
    finally:
        from capinterp.core import distributed as dist

        dist.finish()  # leave the torchrun process group, if this command joined one


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
