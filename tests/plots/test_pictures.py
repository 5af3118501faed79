"""What each picture promises, read from the figure (fast; tests/plots/test_browser.py looks at them in
Chromium): the selected neurons marked, the circuit's edge legend and uncluttered labels, the edge
heatmap's spread and per-layer ticks, the causal-trace grid sized by the page, the report table's
explained headers, circuitsvis views written offline."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from browser_pages import D_MLP, N_LAYERS, circuit, neuron_scores

from capinterp.plots import neuron_heatmap, trace_heatmap
from capinterp.plots.table import column_help, column_label, table_html
from capinterp.units.neurons import NeuronSet


def test_heatmap_marks_the_selected_neurons():
    scores, strong = neuron_scores()
    fig = scores.plot(selected=NeuronSet.from_indices(strong, N_LAYERS, D_MLP), bin_size=16)
    (ring,) = [t for t in fig.data if t.type == "scatter"]
    assert ring.name == "selected (8 neurons)" and ring.showlegend
    # (10, 640) and (11, 641) sit in block 40; (9, 100) in block 6: one ring per (layer, block)
    got = sorted(zip(ring.y, ring.x))
    want = sorted({(layer, (idx // 16) * 16 + 7.5) for layer, idx in strong})
    assert got == want
    assert "layer 9: selected neuron 100" in ring.text
    pairs = neuron_heatmap(scores, selected=strong[:2], bin_size=16)  # (layer, index) pairs work too
    assert len(pairs.data[1].x) == 2
    with pytest.raises(ValueError, match="outside"):
        neuron_heatmap(scores, selected=[(N_LAYERS, 0)])


def test_heatmap_of_a_fitted_localizer_marks_its_neurons():
    scores, strong = neuron_scores()

    class Fitted:  # what a localizer holds after fit
        scores_ = scores
        neurons_ = NeuronSet.from_indices(strong, N_LAYERS, D_MLP)

    fig = neuron_heatmap(Fitted())
    assert fig.data[0].type == "heatmap" and fig.data[1].name == "selected (8 neurons)"


def test_circuit_plot_has_an_edge_legend_and_few_labels():
    c = circuit()
    fig = c.plot()
    legend = {t.name for t in fig.data if t.showlegend is not False and t.name}
    assert "score > 0: supports the answer" in legend and "score < 0: works against it" in legend
    labels = [x for t in fig.data if t.mode == "markers+text" for x in t.text if x]
    assert labels and not any(x.startswith("a") for x in labels)  # heads are named by their axes and hover
    assert list(fig.layout.yaxis.ticktext) == ["h0", "h1", "h2", "h3"]


def test_edge_heatmap_spreads_the_scores_and_ticks_once_per_layer():
    c = circuit()
    fig = c.edge_heatmap()
    hm = fig.data[0]
    z = np.asarray(hm.z, dtype=float)
    edge = c.graph.edge_mask.numpy()
    assert np.isnan(z[~edge]).all()
    # on the linear scale the median edge would be < 1 % of the colour range; here it is a real share
    share = np.nanmedian(np.abs(z[edge])) / hm.zmax
    assert share > 0.15, share
    assert hm.zmin == -hm.zmax
    assert len(fig.layout.xaxis.tickvals) <= N_LAYERS + 2 and fig.layout.xaxis.tickfont.size >= 10
    lin = c.edge_heatmap(scale="linear").data[0]
    raw = c.scores.numpy()[edge]
    assert lin.zmax == pytest.approx(np.quantile(np.abs(raw[raw != 0]), 0.99))
    with pytest.raises(ValueError, match="scale"):
        c.edge_heatmap(scale="log2")


def test_trace_grid_is_sized_by_its_page_unless_long():
    short = trace_heatmap(np.zeros((6, 18)), [f"t{i}" for i in range(6)])
    assert short.layout.height is None  # the page or cell decides
    long = trace_heatmap(np.zeros((40, 18)), [f"t{i}" for i in range(40)])
    assert long.layout.height == 28 * 40 + 120


def test_report_table_headers_are_readable_and_explained():
    assert column_label("drop_random_mean") == "drop, random mean" and column_label("ipp") == "IPP"
    assert "random" in column_help("ipp") and column_help("random_prob_mean").endswith("(the control)")
    assert column_help("paper_ipp").startswith("the paper's reported value of IPP")
    page = table_html(pd.DataFrame({"capability": ["gsm8k"], "ipp": [0.123456], "drop_random_mean": [np.nan]}))
    assert "class='table-wrap'" in page and ">IPP</th>" in page and "0.1235" in page
    assert 'title="ipp: improvement over the best random control' in page
    assert "<code>drop_random_mean</code>" in page  # the columns list under the table


def test_token_view_is_written_offline(tmp_path, tiny):
    from capinterp.plots import attention_view
    from capinterp.plots.html import write_view

    path = write_view(attention_view(tiny, "3+4=", layer=0), tmp_path / "view.html")
    text = path.read_text()
    assert text.startswith("<!doctype html>") and "CircuitsVis.render" in text and "unpkg.com" not in text
    with pytest.raises(TypeError, match="circuitsvis"):
        write_view("<p>not a view</p>", tmp_path / "x.html")


def test_small_located_set_is_ringed():
    ns = NeuronSet.from_indices([(0, 1), (2, 9)], 3, 10)
    fig = ns.plot(bin_size=4)
    assert fig.data[1].name == "located (2 neurons)"
    big = NeuronSet(torch.rand(3, 1000) < 0.5)
    assert len(big.plot(bin_size=4).data) == 1  # a dense set is its colours alone
