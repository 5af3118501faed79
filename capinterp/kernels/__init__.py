"""The computations run over a model and a dataset, shared by the localizers and experiments.

- :mod:`~capinterp.kernels.ig`: the integrated-gradients kernel (KN, CNL) and gradient x activation;
- :mod:`~capinterp.kernels.prefix`: prefix KV-cache reuse for the IG kernel;
- :mod:`~capinterp.kernels.completeness` / :mod:`~capinterp.kernels.adaptive`: IG's per-layer
  completeness error and the adaptive rule;
- :mod:`~capinterp.kernels.tracing`: the batched restoration engine of causal tracing;
- :mod:`~capinterp.kernels.accumulate`: mergeable float64 score sums, checkpoints, resume;
- :mod:`~capinterp.kernels.evaluate`: greedy accuracy and target probability.
"""

__all__: list[str] = []  # a layer of modules: import them by name
