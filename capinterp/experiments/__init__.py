"""The papers' experiments, one module each; every one returns an :class:`ExperimentResult`.

Each module registers itself with :func:`~capinterp.experiments.base.experiment`; importing this
package imports them all and puts ``EXPERIMENTS`` in the declared report order :data:`ORDER`
(a new experiment adds its name there; ``tests/experiments/test_order.py`` checks every
registered experiment appears in it exactly once). The papers:

Huang et al. (ICLR 2025): fidelity (3.1), reliability (3.2), rome_layers (3.2, Fig. 2), decoupling (4), commonality
(split-half, Table 1), convergence (App. E, Fig. 6), enhance (Table 2), erase (Table 3 sigma sweep, Table 4 IPP), cross_capability (Fig. 5), method_comparison (Table 4);
the DCSN paper ("Combination Generalization of Capability-Specific Neurons in LLMs", anon. 2025):
specificity (cohesion/separability, Table 3), forward_reasoning (Table 4), operator_ablation (Table 5), cnlf (neuron-level fine-tuning, Table 6);
Chen et al. (2025): ql_localizers (inconsistent facts per localizer KN / SIG / AMIG, Table 1);
localization quality (MIB, Mueller et al. 2025): faithfulness (CPR / CMD of every localizer against random units), patching_agreement (attribution
against exact activation patching: neurons, FFN layers, attention heads);
unit cards (capinterp.cards): unit_roles (what do CNL's and KN's neurons promote, and where do they fire, against random neurons).
"""

from capinterp.experiments import (  # noqa: F401  (registration; the order is ORDER's)
    cnlf,
    commonality,
    convergence,
    cross_capability,
    decoupling,
    enhance,
    erase,
    faithfulness,
    fidelity,
    forward_reasoning,
    method_comparison,
    operator_ablation,
    patching_agreement,
    ql_localizers,
    reliability,
    rome_layers,
    specificity,
    unit_roles,
)
from capinterp.experiments.base import EXPERIMENTS, Context, ExperimentResult, ExperimentSkipped, experiment, get

#: The report order of the experiments (``capinterp reproduce``, ``results.json``, ``report.html``).
ORDER: tuple[str, ...] = (
    "cnlf",
    "commonality",
    "convergence",
    "cross_capability",
    "decoupling",
    "enhance",
    "erase",
    "fidelity",
    "forward_reasoning",
    "reliability",
    "method_comparison",
    "operator_ablation",
    "ql_localizers",
    "rome_layers",
    "specificity",
    "faithfulness",
    "patching_agreement",
    "unit_roles",
)


def _put_in_order() -> None:
    """Reorder ``EXPERIMENTS`` to :data:`ORDER`; registered experiments missing from it keep their
    registration order after the listed ones (the test fails on them)."""
    registered = dict(EXPERIMENTS)
    EXPERIMENTS.clear()
    EXPERIMENTS.update((n, registered.pop(n)) for n in ORDER if n in registered)
    EXPERIMENTS.update(registered)


_put_in_order()

__all__ = ["EXPERIMENTS", "ORDER", "Context", "ExperimentResult", "ExperimentSkipped", "experiment", "get"]
