"""Run every registered experiment and write one report: ``capinterp reproduce [--quick] --out DIR``.

Layout of ``DIR``::

    run.json                 what the run is (model fingerprint, quick, seed): a rerun must match
    experiments/NAME/        table.csv, figure.json, info.json, neurons/*.capi  (one per experiment)
    cache/                   fitted scores and localizer checkpoints shared between experiments
    results.json             every table (as records), info and timing, rewritten after each step
    report.html              tables and interactive figures, self-contained (plotly.js inlined once;
                             with plotlyjs="directory" loaded from plotly.min.js beside it)

Resuming: an experiment whose folder is complete is loaded, not rerun (with the seconds it took,
kept in its folder's ``timing.json``); one interrupted midway restarts, but its localizer fits
resume from ``cache/``. Every file of ``DIR`` is written atomically (a temporary file, then a
rename: :func:`capinterp.core.atomic.write_atomic`), so a full disk or a kill never leaves a half
``run.json``, ``results.json`` or ``report.html``, and a symbolic link in their place is replaced,
not followed. An OSError while saving (a full disk) stops the run (the experiment's partial folder
removed); a ``run.json`` left empty or damaged by an older version is rewritten when
``results.json`` (or an empty folder) shows the settings agree. A finished experiment's folder holds a
``CHECKSUM`` (SHA-256 of its files): a folder whose files no longer match (edited, truncated,
deleted) is reported and rerun, never loaded as done. An experiment that raises is recorded
(error and traceback in results.json and the report) and the others still run; one that cannot
run on this model (:class:`~capinterp.experiments.ExperimentSkipped`, e.g. the tiny test model
knows none of the facts) is recorded as skipped, with the reason, and is not a failure.

Under ``torchrun`` every rank runs every experiment (the localizer fits, evaluations, tracing,
circuits and Query Localization inside shard their work over the ranks,
:mod:`capinterp.core.distributed`), and only rank 0 writes ``DIR`` and logs.
"""

from __future__ import annotations

import errno
import hashlib
import html
import json
import os
import shutil
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from capinterp.arch.model import model_fingerprint, model_meta
from capinterp.core import distributed as dist
from capinterp.core.atomic import write_atomic
from capinterp.core.protocol import Model
from capinterp.experiments import EXPERIMENTS, Context, ExperimentResult, ExperimentSkipped
from capinterp.kernels.quadrature import IG_RULES
from capinterp.plots.html import check_plotlyjs, include_option, write_plotlyjs
from capinterp.plots.table import TABLE_CSS, table_html

__all__ = ["PAPERS", "listed_titles", "report_html", "reproduce"]

#: The papers the experiments cite, as ``reproduce --list`` names them: short citation -> title and arXiv id.
PAPERS = {
    "Huang et al. 2025": 'Huang et al. 2025, "Capability Localization", arXiv 2502.20992',
    "the DCSN paper, anon. 2025": '"Combination Generalization of Capability-Specific Neurons in LLMs", anon. 2025',
    "DCSN paper, anon. 2025": '"Combination Generalization of Capability-Specific Neurons in LLMs", anon. 2025',
    "Chen et al. 2025": 'Chen et al. 2025, "Knowledge Localization: Mission Not Accomplished?", arXiv 2405.14117',
}
#: Internal paper numbers an older title may carry, as the citation they stand for.
_NUMBERED = {"001": "Huang et al. 2025", "003": "DCSN paper, anon. 2025", "004": "Chen et al. 2025"}


def listed_titles() -> dict[str, str]:
    """Every experiment's title for ``reproduce --list``: each cited paper named by its title and arXiv
    id (once per title), internal paper numbers replaced by the citation."""
    import re

    out = {}
    for name, (title, _) in EXPERIMENTS.items():
        title = re.sub(
            r"papers/(\d{3})(?: Sec\.)?\s*([\d.]*)",
            lambda m: _NUMBERED.get(m.group(1), "the paper") + (f", Sec. {m.group(2)}" if m.group(2) else ""),
            title,
        )
        for short, full in PAPERS.items():
            if full not in title:
                title = title.replace(short, full, 1)
        out[name] = title
    return out


def _config(model: Model, quick: bool, seed: int, ig_rule: str = "papers") -> dict[str, Any]:
    return {
        "model": model_meta(model)["model"],
        "model_fingerprint": model_fingerprint(model),
        "quick": bool(quick),
        "seed": int(seed),
        "ig_rule": ig_rule,
    }


def _damaged_run(out: Path, path: Path, why: str, config: dict[str, Any], log: Any) -> dict[str, Any]:
    """The settings a folder with an empty or unreadable ``run.json`` holds: ``results.json``'s
    config when it has one, ``config`` when the folder holds no result yet; else ValueError."""
    try:
        recorded = json.loads((out / "results.json").read_text())["config"]
    except (OSError, ValueError, KeyError, TypeError):
        recorded = None
    if isinstance(recorded, dict):
        log(f"      {path} was {why}; results.json records the run's settings: using them")
        return recorded
    if not any((out / "experiments").glob("*")):
        log(f"      {path} was {why} (a write cut short?); the folder holds no result yet: rewriting it")
        return config
    raise ValueError(
        f"{path} is {why} and results.json does not record the settings of the results in {out}; "
        "rerun with --fresh to start over there, or use another --out"
    )


def _check_run(out: Path, config: dict[str, Any], log: Any = print) -> None:
    path = out / "run.json"
    if path.exists():
        try:
            old = json.loads(path.read_text())
            if not isinstance(old, dict):
                raise ValueError(f"a JSON {type(old).__name__}, not an object")
        except ValueError as err:  # JSONDecodeError included: empty, truncated or edited
            why = "empty" if path.stat().st_size == 0 else f"damaged ({err})"
            old = _damaged_run(out, path, why, config, log)
        if old != config:
            diff = {k: (old.get(k), v) for k, v in config.items() if old.get(k) != v}
            raise ValueError(f"{out} holds a run with other settings {diff} (old, new); use another --out or --fresh")
    dist.barrier()  # every rank has read the old run.json before rank 0 rewrites it
    if dist.is_main():
        out.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(config, indent=2))
    dist.barrier()


_CHECKSUM = "CHECKSUM"
#: In a finished experiment's folder: the seconds it took, so a resumed run reports them.
_TIMING = "timing.json"


def _digest(d: Path) -> str:
    """SHA-256 over the relative paths and bytes of every file under ``d`` except ``CHECKSUM``."""
    h = hashlib.sha256()
    for f in sorted(p for p in d.rglob("*") if p.is_file() and p.name != _CHECKSUM):
        h.update(f.relative_to(d).as_posix().encode() + b"\x00")
        h.update(f.read_bytes())
    return h.hexdigest()


def _done(folder: Path, name: str) -> bool:
    """True when ``folder/name`` holds a finished result whose files match its checksum."""
    d = folder / name
    need = [d / "info.json", d / "table.csv", d / _CHECKSUM]
    return all(p.is_file() for p in need) and (d / _CHECKSUM).read_text().strip() == _digest(d)


def _seconds(d: Path, prior: dict[str, Any]) -> float | None:
    """The seconds a finished experiment took: from its folder, else from the old results.json."""
    try:
        return float(json.loads((d / _TIMING).read_text())["seconds"])
    except (OSError, ValueError, KeyError, TypeError):
        return prior.get("seconds")


#: OSErrors that are the output disk's, whatever file they name: they stop the run.
_DISK_FAULTS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG}
#: OSErrors that stop the run when they name a file under the output folder.
_WRITE_FAULTS = {errno.EACCES, errno.EPERM, errno.ENAMETOOLONG, errno.EISDIR, errno.ENOTDIR}


def _output_fault(err: BaseException, out: Path) -> bool:
    """Whether ``err`` is a fault of writing the output (a full disk, or a refused write of a file
    under ``out``) rather than an experiment's own failure: such an error stops the run (exit 2 in the CLI)."""
    if not isinstance(err, OSError):
        return False
    if err.errno in _DISK_FAULTS:
        return True
    if err.errno not in _WRITE_FAULTS or not err.filename:
        return False
    try:
        return Path(os.fsdecode(err.filename)).absolute().is_relative_to(out.absolute())
    except (TypeError, ValueError):
        return False


def _save(res: ExperimentResult, folder: Path, seconds: float) -> None:
    """Write a finished experiment's folder: its files, its timing, then its checksum (last: a folder
    without one is unfinished). An OSError (a full disk) removes the partial folder and propagates."""
    try:
        d = res.save(folder)
        write_atomic(d / _TIMING, json.dumps({"seconds": seconds}))
        write_atomic(d / _CHECKSUM, _digest(d))
    except OSError:
        shutil.rmtree(folder / res.name, ignore_errors=True)
        raise


def _load_done(folder: Path, name: str, log: Any) -> ExperimentResult | None:
    """The finished result of ``name``, or None (after clearing a damaged or partial folder)."""
    d = folder / name
    if not d.exists():
        return None
    if _done(folder, name):
        try:
            return ExperimentResult.load(folder, name)
        except Exception as err:
            log(f"      {name}: saved result unreadable ({type(err).__name__}: {err}); rerunning")
    else:
        log(f"      {name}: saved result incomplete or damaged (checksum mismatch); rerunning")
    dist.barrier()  # every rank has decided before rank 0 clears the folder
    if dist.is_main():
        shutil.rmtree(d, ignore_errors=True)
    return None


def reproduce(
    model: Model,
    out: str | Path,
    *,
    quick: bool = False,
    only: Sequence[str] | None = None,
    seed: int = 0,
    batch_size: int = 16,
    fresh: bool = False,
    progress: bool = False,
    log: Any = print,
    ig_rule: str = "papers",
    plotlyjs: str = "embed",
) -> dict[str, Any]:
    """Run the experiments (all, or ``only``), resuming from ``out``; return the results dict.

    ``ig_rule``: ``"papers"`` (right Riemann sum, the papers' rule) or ``"accurate"``
    (Gauss-Legendre, :func:`capinterp.kernels.quadrature.ig_preset`) for every IG-based fit.
    ``plotlyjs``: ``"embed"`` plotly.js in report.html, or ``"directory"``: write ``plotly.min.js``
    beside it once and load it from there (:mod:`capinterp.plots.html`).
    """
    check_plotlyjs(plotlyjs)
    if ig_rule not in IG_RULES:
        raise ValueError(f"ig_rule must be one of {tuple(IG_RULES)}, got {ig_rule!r}")
    names = list(EXPERIMENTS) if only is None else list(only)
    unknown = [n for n in names if n not in EXPERIMENTS]
    if unknown or not names:
        raise ValueError(f"unknown experiment(s) {unknown or names}; available: {', '.join(EXPERIMENTS)}")
    out = Path(out)
    dist.init(model.cfg.device)
    if not dist.is_main():
        log = _quiet
    if fresh and out.exists() and dist.is_main():
        _clear(out)
    dist.barrier()
    config = _config(model, quick, seed, ig_rule)
    _check_run(out, config, log)
    folder = out / "experiments"
    ctx = Context(
        model, quick=quick, seed=seed, workdir=out / "cache", batch_size=batch_size, progress=progress, ig_rule=ig_rule
    )
    prior = _read_results(out)
    results: dict[str, Any] = {"config": config, "experiments": {}}
    done: dict[str, ExperimentResult] = {}
    for i, name in enumerate(names, 1):
        title, run = EXPERIMENTS[name]
        entry: dict[str, Any]
        loaded = _load_done(folder, name, log)
        if loaded is not None:
            done[name] = loaded
            entry = {"seconds": _seconds(folder / name, prior.get(name, {})), "resumed": True}
            log(f"[{i}/{len(names)}] {name}: already done, loaded")
        else:
            log(f"[{i}/{len(names)}] {name}: {title} ...")
            t0 = time.time()
            try:
                res = run(ctx)
                seconds = round(time.time() - t0, 1)
                if dist.is_main():
                    _save(res, folder, seconds)
                dist.barrier()
                done[name] = res
                entry = {"seconds": seconds}
                log(f"      {name} done in {entry['seconds']} s")
            except ExperimentSkipped as err:  # cannot run on this model (e.g. it knows no fact): said, not failed
                entry = {"seconds": round(time.time() - t0, 1), "skipped": str(err)}
                log(f"      {name} SKIPPED: {err}")
            except Exception as err:
                if _output_fault(err, out):  # a full disk or an unwritable --out: no experiment's failure
                    raise
                entry = {
                    "seconds": round(time.time() - t0, 1),
                    "error": f"{type(err).__name__}: {err}",
                    "traceback": traceback.format_exc(),
                }
                log(f"      {name} FAILED: {entry['error']}")
        if name in done:
            r = done[name]
            entry.update(title=r.title, info=r.info, table=json.loads(r.table.to_json(orient="records")))
        else:
            entry["title"] = title
        results["experiments"][name] = entry
        if dist.is_main():
            _write(out, results, done, plotlyjs)
    return results


def _clear(out: Path) -> None:
    """Delete everything in ``out`` but the command line's folder lock (held by this very run)."""
    from capinterp.app.outdir import LOCK_NAME, OWNER_NAME

    for child in out.iterdir():
        if child.name in (LOCK_NAME, OWNER_NAME):
            continue
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()


def _quiet(msg: str) -> None:
    """The log of ranks other than 0 under torchrun."""


def _read_results(out: Path) -> dict[str, Any]:
    try:
        return json.loads((out / "results.json").read_text())["experiments"]
    except (OSError, ValueError, KeyError):
        return {}


def _write(out: Path, results: dict[str, Any], done: dict[str, ExperimentResult], plotlyjs: str = "embed") -> None:
    write_atomic(out / "results.json", json.dumps(results, indent=2, default=str))
    if plotlyjs == "directory":
        write_plotlyjs(out)
    write_atomic(out / "report.html", report_html(results, done, plotlyjs))


def report_html(results: dict[str, Any], done: dict[str, ExperimentResult], plotlyjs: str = "embed") -> str:
    """An HTML page: per experiment its table, figure, paper numbers and timing; self-contained with
    ``plotlyjs="embed"``, loading ``plotly.min.js`` from its folder with ``"directory"``."""
    cfg = results["config"]
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>capinterp reproduction</title>",
        "<style>body{font-family:sans-serif;max-width:1100px;margin:auto;padding:1em}"
        "table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;padding:2px 6px}"
        + TABLE_CSS
        + ".err{color:#b00;white-space:pre-wrap}</style></head><body>",
        f"<h1>capinterp reproduction</h1><p>model <b>{html.escape(str(cfg['model']))}</b>, "
        f"{'quick' if cfg['quick'] else 'full'} mode, seed {cfg['seed']}, integrated gradients: "
        f"<b>{html.escape(cfg.get('ig_rule', 'papers'))}</b> "
        f"({html.escape(IG_RULES.get(cfg.get('ig_rule', 'papers'), '?'))})</p><ul>",
    ]
    for name, e in results["experiments"].items():
        status = "failed" if "error" in e else "skipped" if "skipped" in e else f"{e.get('seconds')} s"
        parts.append(f"<li><a href='#{name}'>{html.escape(e.get('title', name))}</a> ({status})</li>")
    parts.append("</ul>")
    plotly_js: Any = include_option(plotlyjs)
    for name, e in results["experiments"].items():
        parts.append(f"<h2 id='{name}'>{html.escape(e.get('title', name))}</h2>")
        if "error" in e:
            parts.append(f"<p class='err'>{html.escape(e['error'])}\n{html.escape(e.get('traceback', ''))}</p>")
            continue
        if "skipped" in e:
            parts.append(f"<p>skipped: {html.escape(e['skipped'])}</p>")
            continue
        r = done[name]
        parts.append(table_html(r.table))  # scrolls sideways when wide; headers explained
        if r.figure is not None:
            parts.append(r.figure.to_html(full_html=False, include_plotlyjs=plotly_js))
            plotly_js = False
        if r.info:
            info = html.escape(json.dumps(r.info, indent=1, default=str))
            parts.append(f"<details><summary>paper numbers and notes</summary><pre>{info}</pre></details>")
    parts.append("</body></html>")
    return "\n".join(parts)
