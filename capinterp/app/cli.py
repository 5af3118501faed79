"""The ``capinterp`` command line: ``info``, ``evaluate``, ``localize``, ``describe``, ``reproduce`` and
``main`` (the README job).

Every command prints its result as JSON on stdout (logs and progress bars go to
stderr); the options and their checks are in :mod:`capinterp.app.args`."""

from __future__ import annotations

import errno
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from capinterp.app.args import build_parser, check_args
from capinterp.app.outdir import FolderInUse, hold

#: ``capinterp --help``'s description (plain text: argparse prints it as is).
DESCRIPTION = """\
Locate the FFN neurons, layers and circuit edges behind a behaviour of a language model.
Every command prints its result as one JSON document on stdout; logs and progress go to stderr.
Start with 'capinterp main' (the README job), then 'capinterp localize --data FILE' on your own facts."""
CKPT_HINT = "the .ckpt file in the output folder lets a rerun resume; delete it to start over"

__all__ = [
    "COMMANDS",
    "DESCRIPTION",
    "OS_HINTS",
    "cmd_describe",
    "cmd_evaluate",
    "cmd_info",
    "cmd_localize",
    "cmd_main",
    "cmd_reproduce",
    "main",
    "os_error_line",
]


#: What to do after an OSError, by its errno (the one-line error's end).
OS_HINTS = {
    errno.ENOSPC: "free some space or choose another --out, then rerun: no partial file was left, and "
    "finished work resumes",
    errno.EDQUOT: "the disk quota is used up; free some space or choose another --out, then rerun",
    errno.EROFS: "the file system is read-only; choose another --out",
    errno.EACCES: "check the permissions, or choose another --out",
    errno.EPERM: "check the permissions, or choose another --out",
    errno.ENAMETOOLONG: "choose a shorter --out or file name",
}


def os_error_line(err: OSError) -> str:
    """An OSError as one line: the path, the cause (its errno name) and what to do."""
    if err.errno is None or not err.strerror:
        return " ".join(str(err).split())
    where = os.fsdecode(err.filename) if err.filename is not None else ""
    if err.filename2 is not None:
        where += f" -> {os.fsdecode(err.filename2)}"
    cause = f"{err.strerror} ({errno.errorcode.get(err.errno, err.errno)})"
    hint = OS_HINTS.get(err.errno)
    line = (f"{where}: " if where else "") + cause + (f"; {hint}" if hint else "")
    return " ".join(line.split())


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _load(args):
    from capinterp.arch.model import load_model

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
    from capinterp.arch.model import check_cache, model_meta, neuron_hook, valid_neurons

    cache = check_cache(args.model, verify=args.verify) if getattr(args, "verify", None) else None
    if cache:
        _say(
            f"cache {cache['status']}: {cache['verify']} check of {cache['files']} files "
            f"({cache['bytes'] / 1e9:.2f} GB) in {cache['seconds']:.2f} s ({cache['folder']})"
        )
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
        **({"cache": cache} if cache else {}),
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
    if getattr(args, "data", None) is not None:
        return {"data": args.data}
    return {"ops": args.ops, "fmt": args.fmt, "lang": args.lang, "style": args.style}


def cmd_evaluate(args) -> int:
    """``capinterp evaluate``: accuracy and mean target probability on generated arithmetic, one JSON line."""
    from capinterp.kernels.evaluate import evaluate

    model = _load(args)
    res = evaluate(model, args.dataset, batch_size=args.batch_size, progress=True)
    _emit({**_data_echo(args), **res.to_dict()})
    return 0


def _localizer_kwargs(args, cls) -> dict[str, Any]:
    """Constructor arguments from the command line: the IG options given, and causal tracing's
    ``require_correct`` following ``--examples``."""
    from capinterp.app.args import ig_kwargs
    from capinterp.core.constraints import constructor_parameters

    kw = ig_kwargs(args, cls)
    if "require_correct" in constructor_parameters(cls):
        kw["require_correct"] = args.examples == "correct"
    return kw


def _save_units(loc, name: str, out: Path, title: str, plotlyjs: str) -> dict[str, Any]:
    """Write a fitted localizer's results under ``out`` by its unit kind; the JSON fields naming them."""
    from capinterp.core.atomic import write_atomic
    from capinterp.plots.html import write_html

    kind = type(loc).unit_kind
    if kind == "neuron":
        loc.scores_.save(out / f"{name}_scores.capi")
        loc.neurons_.save(out / f"{name}_neurons.capi")
        fig = loc.scores_.plot(title=title, selected=loc.neurons_)
        heatmap = write_html(fig, out / f"{name}_heatmap.html", plotlyjs=plotlyjs)
        return {
            "neurons": len(loc.neurons_),
            "ratio": loc.neurons_.ratio,
            "heatmap": str(heatmap),
            "figure": str(heatmap),
        }
    if kind == "layer":  # causal tracing: the top layers, every layer's score, the traced grid
        scores = [float(v) for v in loc.layer_scores_.tolist()]
        record = {"layers": list(loc.layers_), "layer_scores": scores, "n_traced": loc.n_traced_}
        record["n_skipped"] = loc.skipped_
        write_atomic(out / f"{name}_layers.json", json.dumps(record, indent=2))
        heatmap = write_html(loc.plot(title=title), out / f"{name}_heatmap.html", plotlyjs=plotlyjs)
        return {**record, "units": str(out / f"{name}_layers.json"), "heatmap": str(heatmap), "figure": str(heatmap)}
    # edges: the knowledge circuit
    saved = loc.circuit_.save(out / f"{name}.json")
    figure = write_html(loc.circuit_.plot(), out / f"{name}_graph.html", plotlyjs=plotlyjs)
    return {"edges": len(loc.units_), "ratio": loc.units_.ratio, "units": str(saved), "figure": str(figure)}


def _cards(model, loc, examples: list, out: Path, name: str, args) -> dict[str, Any]:
    """``localize --cards N``: the cards page of the top N located units beside the result."""
    from capinterp.app.describe_cmd import write_cards
    from capinterp.cards import describe

    cards = describe(model, loc, None, task=examples, top=args.cards, batch_size=16, progress=True)
    return {"n": len(cards), **write_cards(cards, out, f"{name}_cards")}


def _certify(model, loc, examples: list, out: Path, name: str, args) -> dict[str, Any]:
    """``localize --certify B``: the bound on what the located set misses, written beside the result."""
    from capinterp.core.atomic import write_atomic
    from capinterp.interventions.certify import certify

    _say(f"certifying with {args.certify} exact patches outside the located set")
    bs = args.batch_size if isinstance(args.batch_size, int) else 16
    cert = certify(
        model, loc, examples, budget=args.certify, tau=args.certify_tau, delta=args.certify_delta, batch_size=bs
    )
    path = out / f"{name}_certificate.json"
    write_atomic(path, json.dumps(cert.to_dict(), indent=2, default=str))
    _say(cert.summary())
    return {
        "summary": cert.summary(),
        "count_bound": cert.count_bound,
        "total_bound": cert.total_bound,
        "file": str(path),
    }


def _need_subjects(method: str, examples: list) -> None:
    """ValueError (before the model loads) when an example has no ``meta["subject"]``."""
    missing = [e for e in examples if not isinstance(e.meta.get("subject"), str) or not e.meta["subject"]]
    if missing:
        raise ValueError(
            f"{method} needs each fact's subject (the entity whose tokens it corrupts): {len(missing)} of "
            f"{len(examples)} examples have none (first: {missing[0].prompt!r}); use --data FILE with a subject "
            "column (or --data builtin); generated arithmetic has no subject"
        )


def cmd_localize(args) -> int:
    """``capinterp localize``: fit a localizer on generated arithmetic or ``--data`` (by default only
    the examples the model answers correctly); write its scores / units and a figure under
    ``--out`` (a checkpoint named by the computation's key too when the class is ``checkpointable``)."""
    from capinterp.app import notes
    from capinterp.app.main_job import choose_examples
    from capinterp.localizers import cost, get

    cls = get(args.method)
    kwargs = _localizer_kwargs(args, cls)  # a bad option for this method is refused before loading
    if args.cards and cls.unit_kind not in ("neuron", "layer", "edge", "expert", "head"):
        raise ValueError(f"--cards: cards of {cls.unit_kind} units are not built yet; neuron and layer methods take it")
    if args.certify and cls.unit_kind not in ("neuron", "layer", "edge", "expert"):
        raise ValueError(f"--certify: {cls.unit_kind} units cannot be certified yet (neurons, layers, experts, edges)")
    if cls.unit_kind != "neuron":  # causal tracing and circuits corrupt the subject's tokens
        _need_subjects(cls.name, args.dataset)
    with hold(args.out) as out:
        model = _load(args)
        eval_batch = args.batch_size if isinstance(args.batch_size, int) else 16
        examples, used = choose_examples(model, args.dataset, args.examples, eval_batch)
        _say(f"localizing on {used['used']} of {used['total']} examples ({args.examples}; {used['dropped']} dropped)")
        extra: dict[str, Any] = {"checkpoint": out / f"{cls.name}-{{key}}.ckpt"} if cls.checkpointable else {}
        before = notes.checkpoint_counts(out) if cls.checkpointable else {}
        loc = cls(model, batch_size=args.batch_size, **extra, **kwargs)
        scope = notes.scope_note(cls.name, cls.scope, len(examples), getattr(loc, "share", 0.5))
        if scope:
            _say("note: " + scope)
        _say(cost.estimate_line(loc, examples))
        loc.fit(examples)
        from capinterp.core import distributed as dist

        if not dist.is_main():  # under torchrun every rank holds the merged result; rank 0 writes it
            return 0
        name = cls.name
        what = f"ops {args.ops}" if args.data is None else f"--data {args.data}"
        result: dict[str, Any] = {"method": name, "unit_kind": cls.unit_kind, "data": args.data or "arithmetic"}
        result |= _save_units(loc, name, out, f"{name.upper()} scores, {what}", args.plotlyjs)
        result |= {"examples": used, "out": str(out), "checkpoint": getattr(loc, "checkpoint_path_", None)}
        ckpt = notes.resume_info(before, result["checkpoint"], used["used"])
        if ckpt:
            result["checkpoint_info"] = ckpt
            line = notes.resume_line(ckpt)
            if line:
                _say(line)
        if scope:
            result["note"] = scope
        if args.cards:
            result["cards"] = _cards(model, loc, examples, out, name, args)
        if args.certify:
            result["certificate"] = _certify(model, loc, examples, out, name, args)
        info = notes.completeness_info(getattr(loc, "meta_", {}))
        if info:
            result["completeness"] = info[0]
            _say(info[1])
        _emit(result)
        _say(f"open {result['figure']} in a browser" + (f"; {CKPT_HINT}" if ckpt else ""))
    return 0


def cmd_describe(args) -> int:
    """``capinterp describe``: the cards page (cards.html) and cards.json of a saved result's top units
    under ``--out`` (:mod:`capinterp.app.describe_cmd`); a JSON summary on stdout."""
    from capinterp.app.describe_cmd import run_describe

    return run_describe(args, _load, _emit)


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
        from capinterp.app.reproduce import listed_titles

        _emit(listed_titles())
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
    "describe": cmd_describe,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line on ``argv``; returns the exit status (2 with a one-line message on bad input
    or an output folder in use; 2 with a one-line error naming the path and the cause on an OSError:
    a full disk, a refused permission, a name too long; 1 with one line when a torchrun peer rank
    hung or died, :class:`~capinterp.core.distributed.RankFailure`)."""
    from capinterp.core.distributed import RankFailure

    args = build_parser(DESCRIPTION).parse_args(argv)
    try:
        if not getattr(args, "list", False):
            check_args(args)
        return int(COMMANDS[args.command](args) or 0)
    except (ValueError, TypeError, FileNotFoundError, FolderInUse) as err:
        print(f"capinterp: error: {err}", file=sys.stderr)
        return 2
    except OSError as err:  # a full disk, a refused permission: outputs are atomic, nothing half-written
        print(f"capinterp: error: {os_error_line(err)}", file=sys.stderr)
        return 2
    except RankFailure as err:  # under torchrun: a peer rank hung or died; the message says what to do
        print(f"capinterp: error: {err}", file=sys.stderr)
        return 1
    finally:
        from capinterp.core import distributed as dist

        dist.finish()  # leave the torchrun process group, if this command joined one


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
