"""Every kind of page capinterp writes, opened in real headless Chromium, offline, at 1400 x 1000.

Each page must draw (a screenshot that is not blank, plotly's SVG or circuitsvis' view in the DOM),
log nothing to the console, load nothing from the network, and fit the window's width. Then each
picture's own promise: the circuit's node labels do not overlap and its edge colours have a legend,
the edge heatmap shows its scores' spread, the causal-trace grid fills the page, the report table
explains its columns and clips none, the neuron heatmap marks the selected neurons. Screenshots are
kept under out/browser/ (CI keeps them as artefacts). Chromium is Debian's ``chromium``
(scripts/test.sh installs it); without it the test is skipped, except on CI (``CI=true``), where
it fails.
"""

from __future__ import annotations

import html
import json
import os
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import browser
import browser_pages as pages
import pytest

OUT = Path(__file__).resolve().parents[2] / "out" / "browser"
ON_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")

# Runs after the page's own scripts: what a user would see, measured, into <body data-probe="...">.
PROBE = """<script>
window.addEventListener('load', function () { setTimeout(function () {
  function box(e) { var b = e.getBoundingClientRect(); return {l: b.left, r: b.right, t: b.top, b: b.bottom}; }
  var labels = Array.from(document.querySelectorAll('.textpoint text'))
    .filter(function (t) { return t.textContent.trim(); }).map(box);
  var overlaps = [];
  for (var i = 0; i < labels.length; i++) for (var j = i + 1; j < labels.length; j++) {
    var a = labels[i], b = labels[j];
    if (a.l < b.r - 1 && b.l < a.r - 1 && a.t < b.b - 1 && b.t < a.b - 1) overlaps.push([i, j]);
  }
  var probe = {
    pageWidth: document.documentElement.scrollWidth, viewWidth: window.innerWidth, viewHeight: window.innerHeight,
    labels: labels.length, overlaps: overlaps.length,
    legend: Array.from(document.querySelectorAll('.legendtext')).map(function (t) { return t.textContent; }),
    xticks: Array.from(document.querySelectorAll('.xtick text')).map(function (t) { return t.textContent; }),
    tickFont: Array.from(document.querySelectorAll('.xtick text, .ytick text')).map(function (t) {
      return parseFloat(getComputedStyle(t).fontSize); }),
    plots: Array.from(document.querySelectorAll('.js-plotly-plot')).map(function (p) {
      var b = p.getBoundingClientRect(); return {top: b.top, height: b.height, width: b.width}; }),
    wraps: Array.from(document.querySelectorAll('.table-wrap')).map(function (w) {
      return {scroll: w.scrollWidth, client: w.clientWidth, overflow: getComputedStyle(w).overflowX}; }),
    headers: Array.from(document.querySelectorAll('th')).map(function (t) {
      return {text: t.textContent, title: t.getAttribute('title') || ''}; })
  };
  document.body.setAttribute('data-probe', JSON.stringify(probe));
}, 300); });
</script>"""


def _probe(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    cut = text.rfind("</body>")
    path.write_text(text[:cut] + PROBE + text[cut:] if cut >= 0 else text + PROBE, encoding="utf-8")


def _build(folder: Path, model) -> dict[str, Path]:
    built = {name: make(folder) for name, make in pages.PLOTLY_PAGES.items()}
    built["report"] = pages.report_page(folder)
    built["neuron_heatmap_directory"] = pages.directory_page(folder / "shared-plotlyjs")
    built["neuron_activations_view"], built["attention_view"] = pages.token_view_pages(folder, model)
    return built


@pytest.fixture(scope="module")
def seen(tiny) -> dict[str, tuple[Path, str, browser.Page, dict]]:
    """Every page built, opened once (in two browsers): name -> (page, its HTML, what Chromium saw, probe)."""
    if browser.chromium() is None:
        if ON_CI:
            pytest.fail("chromium is missing on CI: scripts/test.sh installs Debian's chromium package")
        pytest.skip("chromium is not installed (apt-get install chromium); CI installs it and runs this test")
    OUT.mkdir(parents=True, exist_ok=True)
    built = _build(OUT, tiny)
    sources = {name: path.read_text(encoding="utf-8") for name, path in built.items()}
    for path in built.values():
        _probe(path)

    def look(names: list[str]) -> dict[str, browser.Page]:
        with browser.Session() as chromium:  # one start-up for many pages
            return {name: chromium.open(built[name], OUT / f"{name}.png") for name in names}

    names = list(built)
    with ThreadPoolExecutor(max_workers=2) as pool:  # two browsers, half of the pages each
        found = {k: v for part in pool.map(look, [names[::2], names[1::2]]) for k, v in part.items()}
    out = {}
    for name, page in found.items():
        m = re.search(r'data-probe="([^"]*)"', page.dom)
        probe = json.loads(html.unescape(m.group(1))) if m else {}
        out[name] = (built[name], sources[name], page, probe)
    return out


ALL = [*pages.PLOTLY_PAGES, "report", "neuron_heatmap_directory", "neuron_activations_view", "attention_view"]


@pytest.mark.parametrize("name", ALL)
def test_page_draws_offline(seen, name):
    path, source, page, probe = seen[name]
    assert (OUT / f"{name}.png").is_file()
    assert probe, f"{name}: the page's scripts did not run to the end (no probe in the DOM)"
    assert not page.console, f"{name}: console messages {page.console}"
    assert not re.search(r"<script[^>]+src=[\"']https?:", source), f"{name}: loads a script from the network"
    if name.endswith("_view"):
        assert "CircuitsVis.render" in source
        rendered = page.dom.split('id="circuits-vis-', 1)[-1]  # the view's root, filled by its script
        assert re.search(r">=</(span|button)>", rendered), f"{name}: the view drew no tokens (the prompt ends in '=')"
        assert page.ink() > 0.0005, f"{name}: blank ({page.ink():.4f} of the pixels drawn)"
    else:
        assert "main-svg" in page.dom, f"{name}: plotly drew no SVG"
        assert page.ink() > 0.01, f"{name}: nearly blank ({page.ink():.3f} of the pixels drawn)"
    assert probe["pageWidth"] <= probe["viewWidth"], f"{name}: {probe['pageWidth']} px wide, clipped at 1400"


def test_circuit_labels_do_not_overlap_and_edges_have_a_legend(seen):
    *_, probe = seen["circuit"]
    assert probe["labels"] >= 10 and probe["overlaps"] == 0, probe
    assert any("supports" in t for t in probe["legend"]) and any("against" in t for t in probe["legend"])


def test_edge_heatmap_shows_the_spread_with_readable_ticks(seen):
    _, _, page, probe = seen["edge_heatmap"]
    # below the diagonal is no edge (blank); above it, the cells must not wash out to white
    assert page.ink() > 0.2, f"only {page.ink():.3f} of the page is drawn"
    assert 5 <= len(probe["xticks"]) <= 30 and min(probe["tickFont"]) >= 10, probe["xticks"]


def test_causal_trace_fills_the_page(seen):
    _, _, page, probe = seen["causal_trace"]
    (plot,) = probe["plots"]
    assert plot["height"] >= 0.8 * probe["viewHeight"], plot
    rows = page.ink_rows().nonzero()[0]
    assert rows.max() - rows.min() > 0.6 * page.pixels.shape[0]


def test_report_table_explains_its_columns_and_clips_nothing(seen):
    _, source, _, probe = seen["report"]
    heads = {h["text"]: h["title"] for h in probe["headers"]}
    assert "IPP" in heads and "random set" in heads["IPP"], heads
    assert "drop, random mean" in heads and "averaged" in heads["drop, random mean"]
    assert "drop_random_mean" not in heads and "ipp" not in heads
    for w in probe["wraps"]:  # wider than its box only where the box scrolls sideways
        assert w["scroll"] <= w["client"] or w["overflow"] in ("auto", "scroll"), w


def test_neuron_heatmap_marks_the_selected_neurons(seen):
    *_, probe = seen["neuron_heatmap"]
    assert "selected (8 neurons)" in probe["legend"], probe["legend"]
