"""The compute routines ("kernels") run over a model and a dataset, shared by the localizers and experiments.

- :mod:`~capinterp.kernels.ig`: the integrated-gradients kernel (KN, CNL) and gradient x activation;
- :mod:`~capinterp.kernels.ig_config`: :class:`IGConfig`, the settings of an IG computation, and its
  named presets :data:`PAPERS`, :data:`CLOSED_FORM`, :data:`GAUSS_LEGENDRE`, :data:`ADAPTIVE`;
- :mod:`~capinterp.kernels.sequential`: sequential IG (SIG), one token position at a time;
- :mod:`~capinterp.kernels.quadrature`: the quadrature rules of the IG path integral;
- :mod:`~capinterp.kernels.prefix`: prefix KV-cache reuse and the layer staircase (the ``"fast"`` route);
  :mod:`~capinterp.kernels.prefix_state`: continuing from a prefix's own state (hybrids' mixers,
  compressed attention);
- :mod:`~capinterp.kernels.completeness` / :mod:`~capinterp.kernels.adaptive`: IG's per-layer
  completeness error and the adaptive rule;
- :mod:`~capinterp.kernels.tracing`: the batched restoration engine of causal tracing;
- :mod:`~capinterp.kernels.accumulate`: mergeable float64 score sums, checkpoints, resume;
- :mod:`~capinterp.kernels.evaluate`: greedy accuracy and target probability.

Otherwise a layer of modules: import them by name.
"""

from capinterp.kernels.ig_config import ADAPTIVE, CLOSED_FORM, GAUSS_LEGENDRE, PAPERS, IGConfig

__all__ = ["ADAPTIVE", "CLOSED_FORM", "GAUSS_LEGENDRE", "PAPERS", "IGConfig"]
