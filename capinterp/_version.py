"""The package version, ``capinterp.__version__``."""

__version__ = "0.1.0"
