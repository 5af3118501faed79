"""Located units, neuron scores, and how two sets of units compare: one layer, one protocol.

- :mod:`~capinterp.units.base`: :class:`UnitSet`, the interface every located set shares (neurons,
  layers, circuit edges), and :class:`KeySet` for layers and other keyed units;
- :mod:`~capinterp.units.neurons`: :class:`NeuronScores` (float ``[n_layers, d_mlp]``) and
  :class:`NeuronSet` (bool mask, a UnitSet of kind ``"neuron"``), built in
  :mod:`~capinterp.units.neuron_tensor` (shared shape, metadata, save / load),
  :mod:`~capinterp.units.neuron_scores`, :mod:`~capinterp.units.neuron_set` and
  :mod:`~capinterp.units.neuron_io` (the ``.capi`` file format);
- :mod:`~capinterp.units.metrics`: overlap, IoU, cohesion, separability, ratio, parameter share,
  pairwise matrices, consistency (CS1/CS2), IPP, Otsu; :mod:`~capinterp.units.chance` their chance
  levels, :mod:`~capinterp.units.counts` the |A ∩ B|, |A|, |B| they start from.
"""

from capinterp.units.base import KeySet, UnitSet, check_comparable
from capinterp.units.neurons import NeuronScores, NeuronSet

__all__ = ["KeySet", "NeuronScores", "NeuronSet", "UnitSet", "check_comparable"]
