"""What every experiment shares: its result type, its run context, and the registry.

An experiment is a function ``run(ctx: Context) -> ExperimentResult`` registered with
``@experiment("name", "title")``. It returns one pandas table, one plotly figure, and a small
dict ``info`` (the paper's numbers for comparison, notes). ``ctx.quick`` selects subsets sized for
the 10-minute quick reproduction; ``ctx.workdir`` (if set) is where fitted scores are cached, so
an interrupted reproduction resumes without refitting (see :meth:`Context.scores`).
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pandas as pd

from capinterp.arch.model import model_fingerprint
from capinterp.core import distributed as dist
from capinterp.core.protocol import Model
from capinterp.data.paraphrases import NoKnownFacts
from capinterp.units.neurons import NeuronScores, NeuronSet

__all__ = ["EXPERIMENTS", "Context", "ExperimentResult", "ExperimentSkipped", "Runner", "experiment", "get"]

T = TypeVar("T")


@dataclass
class ExperimentResult:
    """One experiment's output: a table, a figure, and what to compare it with."""

    name: str
    title: str
    table: pd.DataFrame
    figure: Any = None  # plotly.graph_objects.Figure
    info: dict[str, Any] = field(default_factory=dict)
    neurons: dict[str, NeuronSet] = field(default_factory=dict)

    def save(self, folder: str | Path) -> Path:
        """Write table.csv, figure.json, info.json and neurons/*.capi under ``folder/name``."""
        d = Path(folder) / self.name
        d.mkdir(parents=True, exist_ok=True)
        self.table.to_csv(d / "table.csv", index=False)
        if self.figure is not None:
            (d / "figure.json").write_text(self.figure.to_json())
        for key, ns in self.neurons.items():
            ns.save(d / "neurons" / f"{key}.capi")
        info = {"name": self.name, "title": self.title, "info": self.info}
        (d / "info.json").write_text(json.dumps(info, indent=2, default=str))
        return d

    @classmethod
    def load(cls, folder: str | Path, name: str) -> ExperimentResult:
        """Read the result that :meth:`save` wrote under ``folder / name``."""
        import plotly.io as pio

        d = Path(folder) / name
        meta = json.loads((d / "info.json").read_text())
        fig = pio.from_json((d / "figure.json").read_text()) if (d / "figure.json").exists() else None
        neurons = {p.stem: NeuronSet.load(p) for p in sorted((d / "neurons").glob("*.capi"))}
        return cls(name, meta["title"], pd.read_csv(d / "table.csv"), fig, meta["info"], neurons)


@dataclass
class Context:
    """What an experiment runs with: the model, the size mode, the seed and a cache folder."""

    model: Model
    quick: bool = False
    seed: int = 0
    workdir: Path | None = None
    batch_size: int = 16
    progress: bool = False
    ig_rule: str = "papers"

    def size(self, quick: T, full: T) -> T:
        """``quick`` in quick mode, else ``full`` (sample sizes of an experiment)."""
        return quick if self.quick else full

    def ig(self, quick: int, full: int) -> dict[str, Any]:
        """IG ``{"rule", "steps"}`` for this run: ``ig_rule="papers"`` (right Riemann sum with
        ``size(quick, full)`` points) or ``"accurate"`` (Gauss-Legendre, at most
        :data:`~capinterp.kernels.quadrature.ACCURATE_STEPS` points)."""
        from capinterp.kernels.quadrature import ig_preset

        return ig_preset(self.ig_rule, self.size(quick, full))

    def scores(self, key: str, fit: Callable[[], NeuronScores]) -> NeuronScores:
        """``fit()``'s scores, cached as ``workdir/scores/key.capi`` (reused on the next run);
        ``meta["fit_seconds"]`` records how long the fit took."""
        if self.workdir is None:
            return _timed(fit)
        path = Path(self.workdir) / "scores" / f"{key}.capi"
        if path.exists():
            try:
                return NeuronScores.load(path, model_shape=self.model, fingerprint=model_fingerprint(self.model))
            except ValueError:  # damaged (checksum) or made for other weights: refit, never reuse
                pass
        s = _timed(fit)
        if dist.is_main():  # under torchrun every rank holds the merged scores; rank 0 writes them
            path.parent.mkdir(parents=True, exist_ok=True)
            s.save(path, overwrite=True)
        dist.barrier()  # no rank looks for the file before it is complete
        return s

    def localize(self, method: str, data_name: str, examples: list, **params: Any) -> NeuronScores:
        """Scores of dataset localizer ``method`` ("cnl", "dcsn") fitted on ``examples``, cached.

        The cache key is ``method``, ``data_name``, the number of examples and ``params``, so
        experiments that localize the same data with the same method share one fit.
        """
        from capinterp import localizers

        extra = "_".join(f"{k}{v}" for k, v in sorted(params.items()))
        key = f"{method}_{data_name}_n{len(examples)}" + (f"_{extra}" if extra else "")

        cls = localizers.get(method)
        if cls.unit_kind != "neuron" or cls.scope != "dataset":
            raise ValueError(
                f"localize needs a dataset-level neuron localizer "
                f"({', '.join(localizers.available(unit_kind='neuron', scope='dataset'))}), got {method!r}"
            )

        def fit() -> NeuronScores:
            ckpt: dict[str, Any] = {"checkpoint": self.checkpoint(key)} if cls.checkpointable else {}
            return cls(self.model, progress=self.progress, **ckpt, **params).fit(examples).scores_

        return self.scores(key, fit)

    def table(self, key: str, make: Callable[[], pd.DataFrame]) -> pd.DataFrame:
        """``make()``'s table, cached as ``workdir/tables/key.json`` so a rerun resumes after it
        (a damaged file is rebuilt, never trusted); under torchrun rank 0 writes it."""
        if self.workdir is None:
            return make()
        path = Path(self.workdir) / "tables" / f"{key}.json"
        if path.exists():
            try:
                saved = json.loads(path.read_text())
                return pd.DataFrame(saved["data"], columns=saved["columns"]).astype(saved["dtypes"])
            except (ValueError, KeyError, TypeError):
                pass
        frame = make()
        if dist.is_main():
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            saved = {
                "columns": list(frame.columns),
                "dtypes": {c: str(t) for c, t in frame.dtypes.items()},
                "data": frame.to_dict(orient="list"),
            }
            tmp.write_text(json.dumps(saved, default=lambda v: v.item()))  # repr floats: exact round trip
            tmp.replace(path)
        dist.barrier()
        return frame

    def checkpoint(self, key: str) -> Path | None:
        """A checkpoint path for a localizer's ``fit`` (``checkpoint=``), or None without workdir."""
        if self.workdir is None:
            return None
        p = Path(self.workdir) / "checkpoints" / f"{key}.ckpt"
        p.parent.mkdir(parents=True, exist_ok=True)
        return p


def _timed(fit: Callable[[], NeuronScores]) -> NeuronScores:
    """``fit()``, its wall time recorded as ``meta["fit_seconds"]`` (kept in the cached file)."""
    t0 = time.perf_counter()
    s = fit()
    s.meta.setdefault("fit_seconds", time.perf_counter() - t0)
    return s


Runner = Callable[[Context], ExperimentResult]
EXPERIMENTS: dict[str, tuple[str, Runner]] = {}


class ExperimentSkipped(RuntimeError):
    """The experiment cannot run on this model (e.g. it knows none of the facts the experiment
    needs); the message says why and with how many inputs. ``capinterp reproduce`` reports it as
    skipped, not failed."""


def experiment(name: str, title: str) -> Callable[[Runner], Runner]:
    """Decorator registering ``run(ctx)`` under ``name`` (order of registration = report order).

    A :class:`~capinterp.data.paraphrases.NoKnownFacts` from the run (its fact filter removed every
    fact) becomes :class:`ExperimentSkipped` with the filter's counts.
    """

    def deco(fn: Runner) -> Runner:
        if name in EXPERIMENTS:
            raise ValueError(f"experiment {name!r} is registered twice")

        @functools.wraps(fn)
        def run(ctx: Context) -> ExperimentResult:
            try:
                return fn(ctx)
            except NoKnownFacts as err:
                raise ExperimentSkipped(f"{name} needs facts the model knows: {err}") from err

        EXPERIMENTS[name] = (title, run)
        return run

    return deco


def get(name: str) -> Runner:
    """The runner of the experiment registered as ``name``; ValueError listing the registered ones."""
    try:
        return EXPERIMENTS[name][1]
    except KeyError:
        raise ValueError(f"unknown experiment {name!r}; available: {', '.join(EXPERIMENTS)}") from None
