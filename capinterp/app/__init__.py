"""The top layer: the ``capinterp`` command, the README's main job, and ``reproduce``."""

__all__: list[str] = []  # a layer of modules: import them by name
