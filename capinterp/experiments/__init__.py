"""The papers' experiments, one module each; every one returns an :class:`ExperimentResult`.

Each module registers itself with :func:`~capinterp.experiments.base.experiment`; importing this
package imports them all, so ``EXPERIMENTS`` lists every experiment in report order.
"""
from capinterp.experiments.base import EXPERIMENTS, Context, ExperimentResult, experiment, get

__all__ = ["EXPERIMENTS", "Context", "ExperimentResult", "experiment", "get"]
