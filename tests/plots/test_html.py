"""HTML pages with plotly.js embedded, or one shared offline plotly.min.js beside them."""

import plotly.graph_objects as go
import pytest
from plotly.offline import get_plotlyjs

from capinterp.plots.html import write_html


def test_directory_mode_shares_one_local_bundle(tmp_path):
    fig = go.Figure(go.Bar(x=[1, 2], y=[3, 4]))
    a = write_html(fig, tmp_path / "a.html", plotlyjs="directory")
    b = write_html(fig, tmp_path / "b.html", plotlyjs="directory")
    bundle = tmp_path / "plotly.min.js"
    assert bundle.read_text() == get_plotlyjs()  # plotly's own bundled copy: no network
    for page in (a, b):
        text = page.read_text()
        assert '<script charset="utf-8" src="plotly.min.js"></script>' in text
        assert "cdn.plot.ly" not in text and page.stat().st_size < 100_000
    (tmp_path / "sub").mkdir()
    embedded = write_html(fig, tmp_path / "sub" / "c.html")  # default: plotly.js inside the page
    assert embedded.stat().st_size > bundle.stat().st_size and not (tmp_path / "sub" / "plotly.min.js").exists()
    with pytest.raises(ValueError, match="plotlyjs must be one of"):
        write_html(fig, tmp_path / "d.html", plotlyjs="cdn")
