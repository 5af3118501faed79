"""The architecture layer: what capinterp knows about a model's structure, above the basics.

The per-model family record, model loading and the bridge adapters, forward helpers, tiny test
models, and where neurons live: mixture-of-experts, hybrid and dense FFN layers and their weights.
Modules here import ``capinterp.core`` (the model-agnostic basics) and each other, nothing higher.
"""

__all__: list[str] = []  # a layer of modules: import them by name
