"""``capinterp describe``: the cards page of a saved result, and ``localize --cards N``.

``capinterp describe --result FILE [--texts FILE] [--data FILE|NAME] --out DIR`` reads a saved
result (a ``.capi`` file of NeuronScores or a NeuronSet, a saved layer KeySet, or the
``<method>_layers.json`` that ``capinterp localize`` writes for causal tracing), describes its top
units (:func:`capinterp.cards.describe`) and writes ``DIR/cards.html`` (the offline cards page) and
``DIR/cards.json``. ``--texts`` is the corpus; ``--data`` the task (its prompts join the default
corpus, and the task statistics, specificity and ablation effects are measured on it). Every
argument, the result file and the texts are checked before the model loads.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

__all__ = ["check_describe", "describe_args", "load_result", "run_describe", "write_cards"]


def describe_args(p: argparse.ArgumentParser) -> None:
    """The options of ``capinterp describe`` (``--model``, ``--device``, ``--threads`` are added by the caller)."""
    p.add_argument(
        "--result",
        required=True,
        metavar="FILE",
        help="a saved result: NeuronScores or NeuronSet (.capi), a saved layer KeySet (.json), or the "
        "<method>_layers.json of 'capinterp localize --method causal_trace'",
    )
    p.add_argument(
        "--texts",
        default=None,
        metavar="FILE",
        help="the corpus: a .txt file (blank-line-separated paragraphs) or a .jsonl file (a string or a "
        "'text' field per line) (default: the --data prompts plus the data folder's text (CAPINTERP_DATA), "
        "or the built-in text)",
    )
    p.add_argument(
        "--data",
        default=None,
        metavar="FILE|NAME",
        help="the task: a .csv/.json/.jsonl file with prompt and target columns, or a named dataset (as "
        "'capinterp localize --data'); without it, no task statistics, specificity or ablation",
    )
    p.add_argument("--top", type=int, default=50, help="describe at most this many units (the top-ranked)")
    p.add_argument("--k", type=int, default=10, help="top contexts, and promoted / suppressed tokens, per unit")
    p.add_argument("--ablate", type=int, default=10, help="erase each of the top N units alone on --data (0: none)")
    p.add_argument("--max-tokens", type=int, default=None, help="read at most this many tokens of each text")
    p.add_argument("--batch-size", type=int, default=8, help="texts per forward pass")
    p.add_argument(
        "--across-models",
        action="store_true",
        help="describe a result saved for another checkpoint of the same architecture, or one whose file "
        "records no model",
    )
    p.add_argument("--out", default="cards", help="output folder: cards.html and cards.json are written there")


def load_result(spec: str) -> Any:
    """The units saved at ``spec``: NeuronScores / NeuronSet, or a layer KeySet. FileNotFoundError,
    ValueError for a file of no such kind or of units cards do not cover yet (circuits, experts)."""
    from capinterp.cards.inputs import PLANNED
    from capinterp.units.base import KeySet
    from capinterp.units.neurons import load
    from capinterp.units.saved import stored_type

    path = Path(spec).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"--result {spec!r}: no such file")
    kind = stored_type(path)
    if kind in ("NeuronScores", "NeuronSet"):
        return load(path)
    if kind == "Circuit":  # its strongest paths and their nodes (capinterp.cards.circuits)
        from capinterp.circuits.graph import Circuit

        return Circuit.load(path)
    if kind == "KeySet":
        units = KeySet.load(path)
        if units.kind == "edge":  # a hand-made edge set names no graph to find its paths in
            from capinterp.cards.circuits import edge_granularity

            try:
                edge_granularity(units.space)
            except ValueError as err:
                raise ValueError(f"--result {spec!r}: {err}") from None
        if units.kind in ("layer", "edge", "node", "expert", "head"):
            return units
        kind = units.kind
    if kind is not None:
        what = PLANNED.get(kind, f"cards of {kind} units")
        raise ValueError(f"--result {spec!r} holds {kind} units: {what} are planned, not built yet")
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        return KeySet.layers(record["layers"], n_layers=len(record["layer_scores"]))
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        raise ValueError(
            f"--result {spec!r} is no saved result: give a .capi file (NeuronScores, NeuronSet), a saved KeySet, "
            "or a <method>_layers.json from 'capinterp localize'"
        ) from None


def check_describe(args: argparse.Namespace) -> None:
    """Everything ``describe`` reads, checked before the model loads: the result (``args.units``),
    the texts (``args.corpus``), the task (``args.dataset``) and the numbers."""
    from capinterp.app.data_arg import load_data
    from capinterp.cards.inputs import read_texts
    from capinterp.core import validate

    for flag in ("top", "k", "batch_size", "max_tokens"):
        if getattr(args, flag) is not None:
            validate.positive_int("--" + flag.replace("_", "-"), getattr(args, flag))
    validate.nonneg_int("--ablate", args.ablate)
    args.units = load_result(args.result)
    args.corpus = None
    if args.texts is not None:
        args.corpus = read_texts(args.texts)
        if not [t for t in args.corpus if t.strip()]:
            raise ValueError(f"--texts {args.texts!r} holds no text")
    args.dataset = load_data(args.data) if args.data is not None else None


def write_cards(cards: Any, out: Path, stem: str = "cards") -> dict[str, str]:
    """``out/<stem>.html`` and ``out/<stem>.json``; their paths."""
    page = cards.save(out / f"{stem}.html")
    data = cards.save(out / f"{stem}.json")
    return {"page": str(page), "json": str(data)}


def run_describe(args: argparse.Namespace, load: Any, emit: Any) -> int:
    """``capinterp describe``: the cards page and JSON of ``--result``'s top units under ``--out``;
    ``load(args)`` loads the model, ``emit(dict)`` prints the JSON result."""
    from capinterp.app.outdir import hold

    with hold(args.out) as out:
        model = load(args)
        try:
            cards = _describe(model, args)
        except ValueError as err:  # the library's wording of its keyword, as this command's flag
            raise ValueError(str(err).replace("across_models=True", "--across-models")) from None
        from capinterp.core import distributed as dist

        if not dist.is_main():
            return 0
        written = write_cards(cards, out)
        emit({"result": args.result, **cards.meta, "units": [c.label for c in cards], **written, "out": str(out)})
        print(f"open {written['page']} in a browser", file=sys.stderr)
    return 0


def _describe(model: Any, args: argparse.Namespace) -> Any:
    from capinterp.cards import describe

    return describe(
        model,
        args.units,
        args.corpus,
        task=args.dataset,
        top=args.top,
        k=args.k,
        ablate=args.ablate,
        batch_size=args.batch_size,
        max_tokens=args.max_tokens,
        progress=True,
        across_models=args.across_models,
    )
