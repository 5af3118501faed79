"""Located units and how two sets of them compare.

- :mod:`~capinterp.units.base`: :class:`UnitSet`, the interface every located set shares (neurons,
  layers, circuit edges), and :class:`KeySet` for layers and other keyed units;
- :mod:`~capinterp.units.metrics`: overlap, IoU, cohesion, separability, ratio, parameter share,
  pairwise matrices, consistency (CS1/CS2), IPP, Otsu.
"""

from capinterp.units.base import KeySet, UnitSet, check_comparable

__all__ = ["KeySet", "UnitSet", "check_comparable"]
