"""The lowest layer: runtime settings, model loading, tokenization, forward helpers, the Example record.

Nothing here imports any other capinterp package.
"""
