"""Knowledge circuits (Yao et al. 2024): the edge graph of a transformer, edge scores and circuits.

- :mod:`~capinterp.circuits.graph`: :class:`Graph` (nodes, input slots, edges), :class:`Circuit`
  (kept edges + scores, JSON save/load), :class:`EdgeSet`, :func:`select_edges`, :func:`prune_dead`;
- :mod:`~capinterp.circuits.eap`: EAP / EAP-IG edge scores, clean/corrupted pairs;
- :mod:`~capinterp.circuits.acdc`: greedy zero-ablation pruning with MatchNLL;
- :mod:`~capinterp.circuits.forward`: the graph forward pass (per-edge ablation), :func:`hit_at_k`;
- :mod:`~capinterp.circuits.head_patching` / :mod:`~capinterp.circuits.relp`: per-head exact patching
  against AtP, AtP*'s QK fix and GradDrop, and RelP (AtP with LRP rules in the backward pass);
- :mod:`~capinterp.plots.circuits`: layered circuit graph and edge-score heatmap (plotly).

The localizer is :class:`capinterp.localizers.knowledge_circuit.KnowledgeCircuit` (``"knowledge_circuit"``).
"""

from capinterp.circuits.acdc import acdc, match_nll
from capinterp.circuits.eap import Pair, make_pairs, score_edges
from capinterp.circuits.forward import check_additive, graph_mode, node_params, run_graph
from capinterp.circuits.graph import Circuit, EdgeSet, Graph, prune_dead, select_edges
from capinterp.circuits.hit import hit_at_k
from capinterp.plots.circuits import edge_heatmap, plot_circuit

__all__ = [
    "Circuit",
    "EdgeSet",
    "Graph",
    "Pair",
    "acdc",
    "check_additive",
    "edge_heatmap",
    "graph_mode",
    "hit_at_k",
    "make_pairs",
    "match_nll",
    "node_params",
    "plot_circuit",
    "prune_dead",
    "run_graph",
    "score_edges",
    "select_edges",
]
