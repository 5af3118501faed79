"""The command line's arguments: every subcommand's options, and their checks before a model loads.

:func:`build_parser` defines the options; :func:`check_args` checks the values argparse cannot
(devices, positive integers, the ``--out`` path, the data options, by generating the data: it is
cheap) so that every bad argument is a one-line error before the model loads. The data options
mirror :func:`capinterp.data.arithmetic`'s arguments one for one.
"""

from __future__ import annotations

import argparse
from typing import Any

from capinterp.plots.html import PLOTLYJS

#: Commands whose data is generated arithmetic (they get :func:`data_args`).
__all__ = ["DATA_COMMANDS", "batch_size_or_auto", "build_parser", "check_args", "data_args", "data_kwargs"]

DATA_COMMANDS = ("evaluate", "localize", "main")


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="gemma3 (default), smollm2, tiny, a folder, or a TL name")
    p.add_argument("--device", default=None, help="cpu (default), cuda, cuda:1, ...")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")


def batch_size_or_auto(text: str) -> int | str:
    """argparse type of ``localize --batch-size``: an integer or ``auto``."""
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"batch size must be an integer or 'auto', got {text!r}") from None


def _batch_size(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        hint = " ('auto' is for 'capinterp localize' only)" if text == "auto" else ""
        raise argparse.ArgumentTypeError(f"batch size must be an integer, got {text!r}{hint}") from None


def _digits(text: str) -> int | tuple[int, int]:
    """``3`` or ``1-2`` (a range of operand digit counts)."""
    try:
        if "-" in text.strip("-"):
            lo, hi = text.split("-", 1)
            return int(lo), int(hi)
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"digits must be an integer or a range LO-HI such as 1-2, got {text!r}"
        ) from None


def _labels(text: str) -> tuple[str, str]:
    parts = text.split(",")
    if len(parts) != 2:
        raise argparse.ArgumentTypeError(f"--tf-labels takes TRUE,FALSE (two labels), got {text!r}")
    return parts[0], parts[1]


def data_args(p: argparse.ArgumentParser, n: int = 100, *, auto_batch: bool = False) -> None:
    """The options of :func:`capinterp.data.arithmetic` (and ``--batch-size``)."""
    p.add_argument("--ops", default="+", help="operators, e.g. '+' or '+-*/'")
    p.add_argument("--fmt", default="DG", choices=["DG", "MQ", "TF"])
    p.add_argument("--lang", default="en", choices=["en", "zh"])
    p.add_argument(
        "--style",
        default="compact",
        choices=["compact", "fewshot", "zeroshot"],
        help="prompt style (compact needs --lang en with --fmt DG; zh takes fewshot or zeroshot)",
    )
    p.add_argument(
        "--n",
        "--n-examples",
        dest="n",
        type=int,
        default=n,
        help="number of examples (under torchrun write --n-examples: torchrun reads --n as its own)",
    )
    p.add_argument("--n-ops", type=int, default=1, help="operators per expression (1-5)")
    p.add_argument("--digits", type=_digits, default=1, help="operand digits: 1, or a range such as 1-2")
    p.add_argument("--shots", type=int, default=4, help="solved examples before each question (not zeroshot)")
    p.add_argument("--tf-labels", type=_labels, default=("Yes", "No"), help="TF targets TRUE,FALSE (default Yes,No)")
    p.add_argument("--allow-negative", action="store_true", help="allow negative answers")
    p.add_argument("--unique", action="store_true", help="no repeated expressions")
    p.add_argument("--seed", type=int, default=0)
    if auto_batch:
        p.add_argument("--batch-size", type=batch_size_or_auto, default=16, help="an integer, or 'auto'")
    else:
        p.add_argument("--batch-size", type=_batch_size, default=16, help="an integer")


def data_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """:func:`capinterp.data.arithmetic`'s keyword arguments from the data options."""
    return {
        "ops": args.ops,
        "n": args.n,
        "fmt": args.fmt,
        "lang": args.lang,
        "seed": args.seed,
        "n_ops": args.n_ops,
        "digits": args.digits,
        "allow_negative": args.allow_negative,
        "style": args.style,
        "shots": args.shots,
        "tf_labels": args.tf_labels,
        "unique": args.unique,
    }


def _examples_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--examples",
        default="correct",
        choices=["correct", "all"],
        help="localize on the examples the model answers correctly (default) or on all of them",
    )


def _plotlyjs_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--plotlyjs",
        default="embed",
        choices=list(PLOTLYJS),
        help="embed plotly.js in each HTML file (default, ~4.6 MB each) or write one plotly.min.js beside them",
    )


def build_parser(description: str | None = None) -> argparse.ArgumentParser:
    """The argument parser of every subcommand (``capinterp --help`` prints it); ``args.command`` names
    the subcommand (:data:`capinterp.app.cli.COMMANDS` runs it)."""
    ap = argparse.ArgumentParser(prog="capinterp", description=description)
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("info", help="model facts: layers, d_mlp, hook names")
    _common(p)
    p = sub.add_parser("evaluate", help="accuracy and target probability on generated arithmetic")
    _common(p)
    data_args(p)
    p = sub.add_parser("localize", help="run a localizer on generated arithmetic, save scores/neurons/heatmap")
    _common(p)
    data_args(p, auto_batch=True)
    p.add_argument(
        "--method",
        default="cnl",
        help="neuron localizer by registry name (capinterp.localizers.available(unit_kind='neuron'))",
    )
    _examples_arg(p)
    p.add_argument("--out", default="out")
    _plotlyjs_arg(p)
    p = sub.add_parser("reproduce", help="run the papers' experiments, write DIR/report.html and results.json")
    _common(p)
    p.add_argument("--quick", action="store_true", help="small subsets (about 10 minutes on a 2-core CPU)")
    p.add_argument("--out", default="reproduction", help="output folder; a rerun resumes there")
    p.add_argument("--only", default=None, help="comma-separated experiment names (see --list)")
    p.add_argument("--data", default=None, help="evaluation-data folder (sets CAPINTERP_DATA; default: that variable)")
    p.add_argument("--list", action="store_true", help="list the experiments and exit")
    p.add_argument("--fresh", action="store_true", help="delete --out first instead of resuming")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=_batch_size, default=16)
    p.add_argument("--progress", action="store_true", help="progress bars for localizer fits")
    p.add_argument(
        "--ig-rule",
        default="papers",
        choices=["papers", "accurate"],
        help="IG quadrature: the papers' right Riemann sum, or Gauss-Legendre (accurate)",
    )
    _plotlyjs_arg(p)
    p = sub.add_parser("main", help="the README job on the embedded default model")
    _common(p)
    data_args(p, n=40)
    _examples_arg(p)
    p.add_argument("--out", default="out")
    _plotlyjs_arg(p)
    return ap


def check_args(args: argparse.Namespace) -> None:
    """Every argument problem found before a model loads: a ValueError / TypeError naming it.

    For the data commands this also generates the data (``args.dataset``): the generator's own
    checks are the data options' checks."""
    from capinterp.app.outdir import check_out
    from capinterp.core import validate

    validate.device("--device", getattr(args, "device", None))
    for flag in ("threads", "n", "batch_size", "n_ops"):
        value = getattr(args, flag, None)
        if value is not None and value != "auto":
            validate.positive_int("--" + flag.replace("_", "-"), value)
    if getattr(args, "only", None) is not None and not [s for s in args.only.split(",") if s.strip()]:
        raise ValueError(f"--only {args.only!r} names no experiment; omit --only to run them all (see --list)")
    if getattr(args, "out", None) is not None:
        check_out("--out", args.out)
    if args.command in DATA_COMMANDS:
        from capinterp.data import arithmetic

        args.dataset = arithmetic(**data_kwargs(args))
