"""Every kind of page capinterp writes, built fast from synthetic results shaped like Gemma 3 270M's
(18 layers, 4 heads, 1 KV head, 2048 FFN neurons): for tests/plots/test_browser.py.

Each builder writes one page into a folder and returns its path. Plotly pages go through
:func:`capinterp.plots.html.write_html` (plotly.js embedded, as the CLI writes them); the report is
:func:`capinterp.app.reproduce.report_html`; the token views are circuitsvis pages on the tiny model.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import torch

N_LAYERS, N_HEADS, N_KV, D_MLP = 18, 4, 1, 2048


def _rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def neuron_scores():
    """Heavy-tailed scores with a few strong neurons in the middle layers, and the set CNL would keep."""
    from capinterp.units.neurons import NeuronScores

    g = torch.Generator().manual_seed(0)
    s = torch.randn(N_LAYERS, D_MLP, generator=g) * 1e-3
    strong = [(9, 100), (9, 1900), (10, 640), (11, 641), (12, 1500), (13, 77), (14, 1024), (15, 300)]
    for i, (layer, idx) in enumerate(strong):
        s[layer, idx] = 0.05 + 0.01 * i
    return NeuronScores(s, meta={"method": "cnl"}), strong


def circuit():
    """A Gemma 3 sized circuit: every edge scored (heavy tailed, both signs), the top 120 kept."""
    from capinterp.circuits.graph import Circuit, Graph

    g = Graph(N_LAYERS, N_HEADS, N_KV, "qkv")
    rng = _rng(1)
    scores = torch.tensor(rng.standard_t(df=1.5, size=(g.n_src, g.n_slots)) * 1e-3, dtype=torch.float32)
    scores = scores * g.edge_mask
    top = scores.abs().flatten().topk(120).indices
    mask = torch.zeros(g.n_src * g.n_slots, dtype=torch.bool)
    mask[top] = True
    return Circuit(g, mask.view(g.n_src, g.n_slots), scores)


def _write(fig, folder: Path, name: str) -> Path:
    from capinterp.plots.html import write_html

    return write_html(fig, folder / f"{name}.html")


def neuron_heatmap_page(folder: Path) -> Path:
    scores, strong = neuron_scores()
    from capinterp.units.neurons import NeuronSet

    selected = NeuronSet.from_indices(strong, N_LAYERS, D_MLP)
    return _write(
        scores.plot(title="CNL scores (synthetic, Gemma 3 shape)", selected=selected), folder, "neuron_heatmap"
    )


def neuron_set_page(folder: Path) -> Path:
    from capinterp.units.neurons import NeuronSet

    _, strong = neuron_scores()
    return _write(NeuronSet.from_indices(strong, N_LAYERS, D_MLP).plot(), folder, "neuron_set_heatmap")


def directory_page(folder: Path) -> Path:
    """The neuron heatmap written with ``plotlyjs="directory"``: plotly.min.js shared beside the page."""
    from capinterp.plots.html import write_html

    folder.mkdir(parents=True, exist_ok=True)
    return write_html(neuron_scores()[0].plot(), folder / "neuron_heatmap.html", plotlyjs="directory")


def layer_profile_page(folder: Path) -> Path:
    from capinterp.plots import layer_profile

    return _write(layer_profile(neuron_scores()[0]), folder, "layer_profile")


def circuit_page(folder: Path) -> Path:
    return _write(circuit().plot(), folder, "circuit")


def edge_heatmap_page(folder: Path) -> Path:
    return _write(circuit().edge_heatmap(), folder, "edge_heatmap")


def trace_page(folder: Path) -> Path:
    from capinterp.plots import trace_heatmap

    tokens = ["<bos>", "The", " Eiffel*", " Tower*", " is", " located", " in", " the", " city", " of"]
    rng = _rng(2)
    grid = np.abs(rng.normal(0, 0.02, size=(len(tokens), N_LAYERS)))
    grid[3, 4:9] += np.linspace(0.1, 0.4, 5)
    grid[-1, 12:] += 0.3
    return _write(
        trace_heatmap(grid, tokens, kind="mlp", window=10, subject_rows=[2, 3], answer=" Paris"), folder, "causal_trace"
    )


def faithfulness_page(folder: Path) -> Path:
    from capinterp.plots.faithfulness import faithfulness_curve

    frac = np.array([0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0])
    f = np.array([0.05, 0.2, 0.45, 0.7, 0.9, 0.97, 1.0])
    rnd = frac**0.5
    table = pd.DataFrame(
        {
            "fraction": frac,
            "faithfulness": f,
            "ablated_faithfulness": 1 - f,
            "random_faithfulness_mean": rnd,
            "random_faithfulness_p05": rnd * 0.8,
            "random_faithfulness_p95": np.minimum(1, rnd * 1.2),
        }
    )
    return _write(faithfulness_curve(table, title="Faithfulness (synthetic)"), folder, "faithfulness")


def finetune_page(folder: Path) -> Path:
    from capinterp.plots import finetune_figure

    table = pd.DataFrame(
        {
            "arm": ["located", "random", "full"],
            "train_loss_before": [2.1, 2.1, 2.1],
            "train_loss_after": [0.9, 1.8, 0.4],
            "gsm_acc_before": [0.2, 0.2, 0.2],
            "gsm_acc_after": [0.35, 0.22, 0.4],
        }
    )
    return _write(finetune_figure(table), folder, "finetune")


def overlap_page(folder: Path) -> Path:
    from capinterp.units.metrics import overlap_matrix
    from capinterp.units.neurons import NeuronSet

    rng = _rng(3)
    sets = {
        name: NeuronSet.from_indices(
            [(int(a), int(b)) for a, b in zip(rng.integers(0, N_LAYERS, 300), rng.integers(0, D_MLP, 300))],
            N_LAYERS,
            D_MLP,
        )
        for name in ("gsm8k", "emotion", "code", "facts")
    }
    return _write(overlap_matrix(sets, metric="iou"), folder, "overlap_matrix")


def paper_page(folder: Path) -> Path:
    from capinterp.plots import measured_vs_paper

    fig = measured_vs_paper(
        ["KN", "ROME", "KC", "CNL"], [30.1, 20.0, 8.0, 90.5], [37.3, 32.7, 7.2, 96.4], title="Overlap", yaxis_title="%"
    )
    return _write(fig, folder, "measured_vs_paper")


def report_page(folder: Path) -> Path:
    """reproduce's report.html: the erase experiment's full table (its 18 columns) and figure."""
    from capinterp.app.reproduce import report_html
    from capinterp.experiments.base import ExperimentResult
    from capinterp.experiments.erase import COLUMNS, erase_figure

    rng = _rng(4)
    rows = []
    for cap in ("gsm8k", "emotion"):
        for sigma in (4.0, 5.0, 6.0):
            row = {c: float(rng.uniform(0, 1)) for c in COLUMNS}
            row.update(capability=cap, metric="accuracy", sigma=sigma, n_neurons=int(rng.integers(10, 400)))
            row.update(n_test=40, n_random=5)
            rows.append(row)
    table = pd.DataFrame(rows, columns=COLUMNS)
    done = {
        "erase": ExperimentResult("erase", "Erasing capability neurons vs random neurons", table, erase_figure(table))
    }
    results = {
        "config": {"model": "gemma3", "quick": True, "seed": 0, "ig_rule": "papers"},
        "experiments": {
            "erase": {"title": done["erase"].title, "seconds": 12.5},
            "broken": {"title": "An experiment that failed", "error": "ValueError: example", "traceback": "..."},
        },
    }
    path = folder / "report.html"
    path.write_text(report_html(results, done))
    return path


def token_view_pages(folder: Path, m) -> list[Path]:
    """circuitsvis views of model ``m`` (the tiny model), written offline."""
    from capinterp.plots import attention_view, neuron_activations_view
    from capinterp.plots.html import write_view

    a = write_view(neuron_activations_view(m, "3+4=", [(0, 1), (1, 2)]), folder / "neuron_activations_view.html")
    b = write_view(attention_view(m, "3+4=", layer=0), folder / "attention_view.html")
    return [a, b]


PLOTLY_PAGES: dict[str, Callable[[Path], Path]] = {
    "neuron_heatmap": neuron_heatmap_page,
    "neuron_set_heatmap": neuron_set_page,
    "layer_profile": layer_profile_page,
    "circuit": circuit_page,
    "edge_heatmap": edge_heatmap_page,
    "causal_trace": trace_page,
    "faithfulness": faithfulness_page,
    "finetune": finetune_page,
    "overlap_matrix": overlap_page,
    "measured_vs_paper": paper_page,
}
