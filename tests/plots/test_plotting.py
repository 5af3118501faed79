"""Plotly figures: check data (z, hover text, axes), not pixels."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
import pytest
import torch

from capinterp.plots import default_bin_size, layer_profile, neuron_heatmap
from capinterp.units.metrics import overlap_matrix
from capinterp.units.neurons import NeuronScores, NeuronSet


def test_default_bin_size():
    assert default_bin_size(1536) == 12 and default_bin_size(2048) == 16 and default_bin_size(100) == 1


def test_score_heatmap_binning_and_hover():
    s = torch.full((6, 320), 0.001)
    s[5, 263] = -0.0123  # block 16 (neurons 256-271) of layer 5; |score| is what counts
    s[5, 260] = 0.01
    s[0, 319] = 0.5  # in the last block
    fig = neuron_heatmap(NeuronScores(s), bin_size=16)
    hm = fig.data[0]
    z = np.asarray(hm.z)
    assert isinstance(fig, go.Figure) and z.shape == (6, 20)
    assert z[5, 16] == pytest.approx(0.0123) and z[0, 19] == pytest.approx(0.5)
    assert z[1, 0] == pytest.approx(0.001)
    assert hm.text[5][16] == "layer 5, neurons 256-271, max |score| 0.0123 at neuron 263"
    assert hm.text[0][19] == "layer 0, neurons 304-319, max |score| 0.5 at neuron 319"
    assert list(hm.y) == list(range(6))  # layer 0 first = bottom of a plotly heatmap
    assert fig.layout.yaxis.title.text == "layer" and "16" in fig.layout.xaxis.title.text
    assert "%{text}" in hm.hovertemplate


def test_score_heatmap_signed_and_ragged_last_block():
    s = torch.zeros(2, 10)
    s[1, 9] = -2.0
    s[1, 1] = 1.0
    fig = neuron_heatmap(s, bin_size=4, abs=False)  # blocks 0-3, 4-7, 8-9
    z = np.asarray(fig.data[0].z)
    assert z.shape == (2, 3) and z[1, 2] == -2.0 and z[1, 0] == 1.0
    assert fig.data[0].text[1][2].startswith("layer 1, neurons 8-9, score -2 at neuron 9")
    assert fig.data[0].zmid == 0


def test_default_bins_about_128():
    fig = neuron_heatmap(NeuronScores(torch.randn(3, 1536)))
    assert np.asarray(fig.data[0].z).shape == (3, 128)


def test_set_heatmap_counts():
    ns = NeuronSet.from_indices([(0, 0), (0, 3), (0, 4), (2, 9)], 3, 10)
    fig = neuron_heatmap(ns, bin_size=4, title="located")
    z = np.asarray(fig.data[0].z)
    assert z.tolist() == [[2, 1, 0], [0, 0, 0], [0, 0, 1]]
    assert fig.data[0].text[0][0] == "layer 0, neurons 0-3, 2 located: 0, 3"
    assert fig.data[0].text[1][1] == "layer 1, neurons 4-7, 0 located"
    assert fig.layout.title.text == "located"
    bools = neuron_heatmap(ns.mask, bin_size=4)  # a raw bool tensor is a set
    assert np.asarray(bools.data[0].z).tolist() == z.tolist()


def test_overlap_matrix():
    a = NeuronSet.from_indices([(0, 1), (0, 2), (1, 3)], 3, 5)
    b = NeuronSet.from_indices([(0, 2), (1, 3), (1, 4), (2, 0)], 3, 5)
    fig = overlap_matrix({"gsm8k": a, "emotion": b}, metric="iou")
    hm = fig.data[0]
    z = np.asarray(hm.z)
    assert list(hm.x) == ["gsm8k", "emotion"] and np.allclose(z, [[1, 0.4], [0.4, 1]])
    assert hm.text[0][1] == "0.40" and hm.texttemplate == "%{text}"
    assert hm.customdata[0][1] == "gsm8k vs emotion: iou 0.400 (|A∩B|=2, |A|=3, |B|=4)"
    assert (hm.zmin, hm.zmax) == (0.0, 1.0)


def test_layer_profile():
    ns = NeuronSet.from_indices([(0, 1), (0, 2), (2, 3)], 3, 5)
    fig = layer_profile(ns)
    assert list(fig.data[0].y) == [2, 0, 1] and fig.layout.xaxis.title.text == "layer"
    sc = NeuronScores(torch.tensor([[1.0, -2.0], [0.5, 0.0]]))
    fig2 = layer_profile(sc)
    assert np.allclose(fig2.data[0].y, [3.0, 0.5]) and fig2.layout.yaxis.title.text == "sum |score|"


def test_bad_bin_size():
    with pytest.raises(ValueError):
        neuron_heatmap(torch.zeros(2, 4), bin_size=0)
