"""The command line's arguments: every subcommand's options, and their checks before a model loads.

:func:`build_parser` defines the options; :func:`check_args` checks the values argparse cannot
(devices, positive integers, the ``--out`` path, the data options, by generating the data: it is
cheap) so that every bad argument is a one-line error before the model loads. The data options
mirror :func:`capinterp.data.arithmetic`'s arguments one for one.
"""

from __future__ import annotations

import argparse
from typing import Any

from capinterp.app.data_arg import data_option, load_data
from capinterp.app.describe_cmd import check_describe, describe_args
from capinterp.kernels.quadrature import ADAPTIVE_RULE, RULES
from capinterp.plots.html import PLOTLYJS

__all__ = [
    "DATA_COMMANDS",
    "IG_OPTIONS",
    "HelpFormatter",
    "batch_size_or_auto",
    "build_parser",
    "check_args",
    "data_args",
    "data_kwargs",
    "ig_kwargs",
    "model_names",
]

#: Commands whose data is generated arithmetic (they get :func:`data_args`).
DATA_COMMANDS = ("evaluate", "localize", "main")
#: The IG options (``--rule``, ``--steps``, ``--tol``, ``--completeness-tol``): the constructor argument each sets.
IG_OPTIONS = {"rule": "rule", "steps": "steps", "tol": "tol", "completeness_tol": "completeness_tol"}


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Every option's help ends with its default (``(default: X)``) unless the text already states it
    or there is none to state (a flag, or a default of None that the help text explains)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if "default" in text or default is None or default is False or default == argparse.SUPPRESS:
            return text
        if not action.option_strings:
            return text
        shown = ",".join(map(str, default)) if isinstance(default, tuple) else default
        return f"{text} (default: {shown})"


def model_names() -> list[str]:
    """Every model name ``--model`` loads without a path: the packaged models, then the tiny test models."""
    from capinterp.arch.model import _PACKAGED  # the registry of packaged models

    return [*sorted(_PACKAGED), "tiny", "tiny-native"]


def _common(p: argparse.ArgumentParser) -> None:
    names = model_names()
    p.add_argument(
        "--model",
        default=None,
        help=f"{', '.join(names)}, a transformers model folder, or a TransformerLens model name "
        "in the local Hugging Face cache (default: gemma3)",
    )
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1, ... (default: cpu)")
    p.add_argument(
        "--threads", type=int, default=None, help="torch CPU threads (default: $CAPINTERP_THREADS, else torch's)"
    )


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
    p.add_argument(
        "--fmt",
        default="DG",
        choices=["DG", "MQ", "TF"],
        help="question format: DG direct generation ('3+4='), MQ multiple choice, TF true/false",
    )
    p.add_argument("--lang", default="en", choices=["en", "zh"], help="prompt language")
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
        default=None,
        help=f"number of examples (default: {n}; with --data: every record). Under torchrun write "
        "--n-examples: torchrun reads --n as its own",
    )
    p.set_defaults(n_default=n)
    p.add_argument("--n-ops", type=int, default=1, help="operators per expression (1-5)")
    p.add_argument("--digits", type=_digits, default=1, help="operand digits: 1, or a range such as 1-2")
    p.add_argument("--shots", type=int, default=4, help="solved examples before each question (not zeroshot)")
    p.add_argument("--tf-labels", type=_labels, default=("Yes", "No"), help="TF targets TRUE,FALSE (default Yes,No)")
    p.add_argument("--allow-negative", action="store_true", help="allow negative answers")
    p.add_argument("--unique", action="store_true", help="no repeated expressions")
    p.add_argument(
        "--seed", type=int, default=0, help="seed of the data generator (main: also of the first random-neuron set)"
    )
    if auto_batch:
        p.add_argument(
            "--batch-size", type=batch_size_or_auto, default=16, help="rows per forward pass: an integer, or 'auto'"
        )
    else:
        p.add_argument("--batch-size", type=_batch_size, default=16, help="rows per forward pass")


def data_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """:func:`capinterp.data.arithmetic`'s keyword arguments from the data options."""
    return {
        "ops": args.ops,
        "n": args.n if args.n is not None else args.n_default,
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


def ig_args(p: argparse.ArgumentParser) -> None:
    """``--rule``, ``--steps``, ``--tol``, ``--completeness-tol``: the IG settings of CNL, KN, SIG and AMIG
    (``--steps`` and ``--rule`` also of knowledge_circuit's EAP-IG, ``--steps`` of NeFT). Left out,
    each method keeps its own default."""
    rules = [*RULES, ADAPTIVE_RULE]
    p.add_argument(
        "--rule",
        default=None,
        choices=rules,
        help="IG quadrature rule (default: the method's, 'right': the papers' right Riemann sum); "
        "'adaptive' refines each layer until its error estimate is below --tol",
    )
    p.add_argument(
        "--steps",
        type=int,
        default=None,
        help="IG interpolation points (default: the method's, 20 for CNL/KN/SIG/AMIG)",
    )
    p.add_argument(
        "--tol",
        type=float,
        default=None,
        help="the adaptive rule's error tolerance (default: the method's, 0.001); needs --rule adaptive",
    )
    p.add_argument(
        "--completeness-tol",
        type=float,
        default=None,
        help="warn when a layer's IG completeness error exceeds this (default: the method's; "
        "the completeness is reported either way)",
    )


def ig_kwargs(args: argparse.Namespace, cls: type) -> dict[str, Any]:
    """The IG options given on the command line, as ``cls``'s constructor arguments; ValueError when
    ``cls`` does not take one of them (naming the methods that do)."""
    from capinterp.core.constraints import constructor_parameters

    given = {opt: getattr(args, opt, None) for opt in IG_OPTIONS}
    given = {opt: v for opt, v in given.items() if v is not None}
    if not given:
        return {}
    params = constructor_parameters(cls)  # the keywords its constructors pass on (**kwargs) too
    missing = [opt for opt in given if IG_OPTIONS[opt] not in params]
    if missing:
        flags = ", ".join("--" + m.replace("_", "-") for m in missing)
        raise ValueError(
            f"{flags}: the method {getattr(cls, 'name', cls.__name__)!r} has no such setting "
            "(the IG methods cnl, kn, sig and amig take --rule, --steps, --tol and --completeness-tol)"
        )
    if "tol" in given and (given.get("rule") or "right") != ADAPTIVE_RULE:
        raise ValueError("--tol is the adaptive rule's tolerance: add --rule adaptive (or drop --tol)")
    return {IG_OPTIONS[opt]: v for opt, v in given.items()}


def _plotlyjs_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--plotlyjs",
        default="embed",
        choices=list(PLOTLYJS),
        help="embed plotly.js in each HTML file (default: embed, several MB each) or write one plotly.min.js "
        "beside them (directory)",
    )


def certify_args(p: argparse.ArgumentParser) -> None:
    """``localize --certify B`` and its bound's settings (:func:`capinterp.interventions.certify.certify`)."""
    p.add_argument(
        "--certify",
        type=int,
        default=None,
        metavar="B",
        help="after the fit, bound what the located set misses from B exact single-unit patches outside it "
        "(<method>_certificate.json; see docs/certify.md)",
    )
    p.add_argument(
        "--certify-tau",
        type=float,
        default=0.01,
        metavar="T",
        help="the effect (drop of p(target)) that counts as missed",
    )
    p.add_argument("--certify-delta", type=float, default=0.05, metavar="D", help="the error probability of each bound")


def check_certify(args: argparse.Namespace) -> None:
    """``--certify B``, ``--certify-tau`` in [0, 1) and ``--certify-delta`` in (0, 1), before the model loads."""
    from capinterp.core import validate

    if args.certify is not None:
        validate.positive_int("--certify", args.certify)
    validate.probability("--certify-tau", args.certify_tau, high_open=True)
    validate.finite_float("--certify-delta", args.certify_delta, low=0.0, high=1.0, low_open=True, high_open=True)


def build_parser(description: str | None = None) -> argparse.ArgumentParser:
    """The argument parser of every subcommand (``capinterp --help`` prints it); ``args.command`` names
    the subcommand (:data:`capinterp.app.cli.COMMANDS` runs it)."""
    fmt = {"formatter_class": HelpFormatter}
    ap = argparse.ArgumentParser(prog="capinterp", description=description, **fmt)  # type: ignore[arg-type]
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, text: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=text, description=text, **fmt)  # type: ignore[arg-type]

    p = command("info", "model facts: layers, d_mlp, hook names")
    _common(p)
    p.add_argument(
        "--verify",
        nargs="?",
        const="full",
        choices=["quick", "full"],
        help="first check a packaged model's cache against the checksums written with it (full: every byte, "
        "the default; quick: what every load checks) and rebuild it from the packaged GGUF if damaged",
    )
    p = command("evaluate", "accuracy and target probability on generated arithmetic or --data")
    _common(p)
    data_option(p)
    data_args(p)
    p = command("localize", "run a localizer on generated arithmetic or on --data; save its scores, units and a figure")
    _common(p)
    data_option(p)
    data_args(p, auto_batch=True)
    p.add_argument(
        "--method",
        default="cnl",
        help="localizer by registry name: neuron localizers (cnl, dcsn, kn, sig, amig, neft), causal_trace "
        "(layers; facts with a subject), knowledge_circuit (edges; facts with a subject)",
    )
    _examples_arg(p)
    ig_args(p)
    p.add_argument("--out", default="out", help="output folder (created; a rerun of the same fit resumes there)")
    _plotlyjs_arg(p)
    p.add_argument(
        "--cards",
        type=int,
        default=None,
        metavar="N",
        help="also write the cards page of the top N located units (<method>_cards.html and .json; "
        "neuron and layer methods; see 'capinterp describe')",
    )
    certify_args(p)
    p = command("describe", "what the units of a saved result do: cards.html (offline cards page) and cards.json")
    _common(p)
    describe_args(p)
    p = command("reproduce", "run the papers' experiments, write DIR/report.html and results.json")
    _common(p)
    p.add_argument("--quick", action="store_true", help="small subsets (minutes on a CPU, not hours)")
    p.add_argument("--out", default="reproduction", help="output folder; a rerun resumes there")
    p.add_argument("--only", default=None, help="comma-separated experiment names (default: all; see --list)")
    p.add_argument(
        "--data", default=None, help="evaluation-data folder (sets CAPINTERP_DATA; default: that variable, if set)"
    )
    p.add_argument("--list", action="store_true", help="list the experiments and exit")
    p.add_argument("--fresh", action="store_true", help="delete --out first instead of resuming")
    p.add_argument("--seed", type=int, default=0, help="seed of every experiment's data and random baselines")
    p.add_argument("--batch-size", type=_batch_size, default=16, help="rows per forward pass")
    p.add_argument("--progress", action="store_true", help="progress bars for localizer fits")
    p.add_argument(
        "--ig-rule",
        default="papers",
        choices=["papers", "accurate"],
        help="IG quadrature: the papers' right Riemann sum, or Gauss-Legendre (accurate)",
    )
    _plotlyjs_arg(p)
    p = command("main", "the README job: evaluate, locate CNL neurons, heatmap, erase located vs random neurons")
    _common(p)
    data_args(p, n=40)
    _examples_arg(p)
    ig_args(p)
    p.add_argument(
        "--random-seeds",
        type=int,
        default=3,
        help="random neuron sets (seeds --seed, --seed+1, ...) erased as the baseline; each costs one evaluation",
    )
    p.add_argument(
        "--cards",
        type=int,
        default=20,
        metavar="N",
        help="also write the cards page of the top N located CNL neurons (cnl_cards.html and .json; 0: none; "
        "see 'capinterp describe')",
    )
    p.add_argument("--out", default="out", help="output folder (created; a rerun resumes the CNL fit there)")
    _plotlyjs_arg(p)
    return ap


#: Arithmetic options that --data replaces (a value other than the default is refused with --data).
_ARITHMETIC_OPTIONS = (
    "ops",
    "fmt",
    "lang",
    "style",
    "n_ops",
    "digits",
    "shots",
    "tf_labels",
    "allow_negative",
    "unique",
)


def check_args(args: argparse.Namespace) -> None:
    """Every argument problem found before a model loads: a ValueError / TypeError naming it.

    For the data commands this also reads or generates the data (``args.dataset``): the
    generator's and the loaders' own checks are the data options' checks."""
    from capinterp.app.outdir import check_out
    from capinterp.core import validate

    validate.device("--device", getattr(args, "device", None))
    check_model_arg(getattr(args, "model", None))
    if args.command == "main":  # the main job's --cards 0 writes no cards page
        validate.nonneg_int("--cards", args.cards)
    for flag in ("threads", "n", "batch_size", "n_ops", "steps", "random_seeds", "cards"):
        value = getattr(args, flag, None)
        if flag == "cards" and args.command == "main":
            continue
        if value is not None and value != "auto":
            validate.positive_int("--" + flag.replace("_", "-"), value)
    for flag in ("tol", "completeness_tol"):
        value = getattr(args, flag, None)
        if value is not None and not value > 0:
            raise ValueError(f"--{flag.replace('_', '-')} must be a number > 0, got {value}")
    if getattr(args, "only", None) is not None and not [s for s in args.only.split(",") if s.strip()]:
        raise ValueError(f"--only {args.only!r} names no experiment; omit --only to run them all (see --list)")
    if getattr(args, "out", None) is not None:
        check_out("--out", args.out)
    if args.command == "describe":
        check_describe(args)
    if args.command == "localize":
        check_certify(args)
    if args.command in DATA_COMMANDS:
        if getattr(args, "data", None) is not None:
            defaults = build_parser().parse_args([args.command])
            given = [o for o in _ARITHMETIC_OPTIONS if getattr(args, o) != getattr(defaults, o)]
            if given:
                flags = ", ".join("--" + o.replace("_", "-") for o in given)
                raise ValueError(f"{flags} shape generated arithmetic; with --data {args.data!r} leave them out")
            args.dataset = load_data(args.data, limit=args.n, seed=args.seed)
        else:
            from capinterp.data import arithmetic

            args.dataset = arithmetic(**data_kwargs(args))


def check_model_arg(name: str | None) -> None:
    """``--model`` that names a path: FileNotFoundError when the folder does not exist, ValueError
    when it is a file (before anything loads). Names without a path's marks are left to the loader."""
    import os
    from pathlib import Path

    if name is None or name in model_names():
        return
    path = Path(name).expanduser()
    if path.is_file():
        raise ValueError(f"--model {name!r} is a file; give a transformers model folder (with config.json)")
    looks_like_path = (
        os.path.isabs(name) or name.startswith((".", "~")) or name.endswith(("/", os.sep)) or name.count("/") > 1
    )
    if looks_like_path and not path.exists():
        raise FileNotFoundError(
            f"--model {name!r}: folder not found; give an existing transformers model folder "
            f"(with config.json) or one of {', '.join(model_names())}"
        )
