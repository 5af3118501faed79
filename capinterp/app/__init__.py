"""The top layer: the ``capinterp`` command, the README's main job, and ``reproduce``."""
