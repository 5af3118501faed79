"""The lowest layer: the model-agnostic basics.

Runtime settings, input validation, the ``Example`` record and tokenization with in-context
targets, the ``Model`` protocol, model fingerprints, parameter copies, offloaded-weight access,
torch.distributed, atomic writes and path limits, the model cache's integrity and GGUF parts.
Nothing here imports any other capinterp package; what knows a model's architecture is one layer
up, in ``capinterp.arch``.
"""

__all__: list[str] = []  # a layer of modules: import them by name
