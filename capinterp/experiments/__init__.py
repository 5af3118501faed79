"""The papers' experiments, one module each; every one returns an :class:`ExperimentResult`.

Each module registers itself with :func:`~capinterp.experiments.base.experiment`; importing this
package imports them all, so ``EXPERIMENTS`` lists every experiment in report order:

Huang et al. (ICLR 2025): fidelity (3.1), reliability (3.2), rome_layers (3.2, Fig. 2), decoupling (4), commonality
(split-half, Table 1), convergence (App. E, Fig. 6), enhance (Table 2), erase (Table 3 sigma sweep, Table 4 IPP), cross_capability (Fig. 5), method_comparison (Table 4);
the DCSN paper ("Combination Generalization of Capability-Specific Neurons in LLMs", anon. 2025):
specificity (cohesion/separability, Table 3), forward_reasoning (Table 4), operator_ablation (Table 5), cnlf (neuron-level fine-tuning, Table 6);
Chen et al. (2025): ql_localizers (inconsistent facts per localizer KN / SIG / AMIG, Table 1).
"""

from capinterp.experiments import (  # noqa: F401  (registration, in report order)
    cnlf,
    commonality,
    convergence,
    cross_capability,
    decoupling,
    enhance,
    erase,
    fidelity,
    forward_reasoning,
    method_comparison,
    operator_ablation,
    ql_localizers,
    reliability,
    rome_layers,
    specificity,
)
from capinterp.experiments.base import EXPERIMENTS, Context, ExperimentResult, ExperimentSkipped, experiment, get

__all__ = ["EXPERIMENTS", "Context", "ExperimentResult", "ExperimentSkipped", "experiment", "get"]
