"""The lowest layer: runtime settings, model loading, tokenization, forward helpers, the Example record.

Nothing here imports any other capinterp package.
"""

__all__: list[str] = []  # a layer of modules: import them by name
