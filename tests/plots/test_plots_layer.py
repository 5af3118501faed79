"""The plots layer reads its inputs by attribute: no plots module names a higher layer, not even for
type annotations (``if TYPE_CHECKING:`` blocks included, which tests/test_architecture.py skips)."""

from __future__ import annotations

import ast
from pathlib import Path

import torch

PLOTS = Path(__file__).resolve().parents[2] / "capinterp" / "plots"
LOWER = ("capinterp._version", "capinterp.core", "capinterp.arch", "capinterp.data", "capinterp.plots")


def _capinterp_imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level:
            found.add(node.module or "")
    return {m for m in found if m.split(".")[0] == "capinterp"}


def test_plots_name_no_higher_layer_even_for_types():
    bad = {
        f"{p.name}: {m}"
        for p in sorted(PLOTS.glob("*.py"))
        for m in _capinterp_imports(p)
        if not any(m == low or m.startswith(low + ".") for low in LOWER)
    }
    assert not bad, f"plots modules import higher layers: {sorted(bad)}"


def test_circuit_figures_take_any_object_with_the_attributes():
    """A circuit is read by attribute: the real one draws as before (tiny graph, no model)."""
    from capinterp.circuits.graph import Circuit, Graph
    from capinterp.plots.circuits import edge_heatmap, plot_circuit

    g = Graph(n_layers=2, n_heads=2, n_kv_heads=1)
    scores = torch.linspace(-1.0, 1.0, g.n_src * g.n_slots).reshape(g.n_src, g.n_slots) * g.edge_mask
    c = Circuit(g, scores.abs() > 0.5, scores)
    fig = plot_circuit(c)
    names = [t.name for t in fig.data if t.name]
    assert {"input", "attn", "mlp", "logits"} <= set(names)
    hover = [t for t in fig.data if t.hovertext is not None and t.mode == "markers"][0]
    assert len(hover.x) == len(c)  # one hover point per drawn edge
    assert edge_heatmap(c).data[0].z.shape == (g.n_src, g.n_slots)
