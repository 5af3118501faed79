"""The cards page opened in real headless Chromium, offline, at 1400 x 1000, as a user sees it.

It must draw, log nothing to the console, load nothing from the network, fit the window's width,
show a card per unit with highlighted tokens and an outlined focus token, and its summary table
must sort by a click on a column head (ascending, then descending). The screenshot is kept under
out/browser/cards.png. Chromium is Debian's ``chromium``; without it the test is skipped, except on
CI (``CI=true``), where it fails.
"""

from __future__ import annotations

import html
import json
import os
import re
from pathlib import Path

import browser
import pytest

import capinterp as ci

OUT = Path(__file__).resolve().parents[2] / "out" / "browser"
ON_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")

# After the page's own script: click the "specificity" head twice, and record what a user would see.
PROBE = """<script>
window.addEventListener('load', function () { setTimeout(function () {
  var heads = Array.from(document.querySelectorAll('table.sortable th'));
  var col = heads.findIndex(function (h) { return h.textContent === 'specificity'; });
  function column() { return Array.from(document.querySelectorAll('table.sortable tbody tr')).map(function (r) {
    return parseFloat(r.cells[col].getAttribute('data-v')); }); }
  var before = column();
  heads[col].click(); var up = column();
  heads[col].click(); var down = column();
  var tokens = Array.from(document.querySelectorAll('.tok'));
  var probe = {
    pageWidth: document.documentElement.scrollWidth, viewWidth: window.innerWidth,
    cards: document.querySelectorAll('.card').length, before: before, up: up, down: down,
    focus: document.querySelectorAll('.tok.focus').length,
    focusOutline: tokens.length ? getComputedStyle(document.querySelector('.tok.focus')).outlineStyle : '',
    coloured: tokens.filter(function (t) { return !/rgba\\(\\d+, \\d+, \\d+, 0\\)/.test(getComputedStyle(t).backgroundColor); }).length,
    bars: document.querySelectorAll('.card svg rect').length
  };
  document.body.setAttribute('data-probe', JSON.stringify(probe));
}, 300); });
</script>"""


@pytest.fixture(scope="module")
def seen(tiny):
    if browser.chromium() is None:
        if ON_CI:
            pytest.fail("chromium is missing on CI: scripts/test.sh installs Debian's chromium package")
        pytest.skip("chromium is not installed (apt-get install chromium); CI installs it and runs this test")
    import torch

    scores = ci.NeuronScores(torch.randn(4, 128, generator=torch.Generator().manual_seed(5)))
    texts = ["The cat sat on the mat.", "1+2=3 and 4+5=9", "<b>bold</b> & 'quotes'", "Rome is in Italy."]
    task = ci.data.arithmetic(ops="+", n=4)
    cards = ci.describe(tiny, scores, texts, task=task, top=6, k=3, ablate=1, progress=False)
    OUT.mkdir(parents=True, exist_ok=True)
    path = cards.save(OUT / "cards.html")
    source = path.read_text(encoding="utf-8")
    cut = source.rfind("</body>")
    path.write_text(source[:cut] + PROBE + source[cut:], encoding="utf-8")
    page = browser.open_page(path, OUT / "cards.png")
    m = re.search(r'data-probe="([^"]*)"', page.dom)
    probe = json.loads(html.unescape(m.group(1))) if m else {}
    return cards, source, page, probe


def test_cards_page_draws_offline_and_fits(seen):
    cards, source, page, probe = seen
    assert probe, "the page's scripts did not run to the end (no probe in the DOM)"
    assert not page.console, page.console
    assert not re.search(r"<(script|link|img)[^>]+(src|href)=[\"']https?:", source)
    assert page.ink() > 0.02, f"nearly blank ({page.ink():.3f} of the pixels drawn)"
    assert probe["pageWidth"] <= probe["viewWidth"], probe
    assert probe["cards"] == len(cards) == 6
    assert probe["focus"] == sum(len(c.contexts) for c in cards) and probe["focusOutline"] == "solid"
    assert probe["coloured"] > 0 and probe["bars"] > 0


def test_cards_table_sorts_by_a_click(seen):
    cards, _, _, probe = seen
    assert probe["before"] == pytest.approx([c.specificity for c in cards], rel=1e-4)
    assert probe["up"] == sorted(probe["before"]) and probe["down"] == sorted(probe["before"], reverse=True)
    assert probe["up"] != probe["before"]  # the click changed the order (the input is ranked by score)


# Circuit cards: every link of a path card leads to a card on the page, and the page still fits.
CIRCUIT_PROBE = """<script>
window.addEventListener('load', function () { setTimeout(function () {
  var links = Array.from(document.querySelectorAll('.card a[href^="#card-"]'));
  var probe = {
    pageWidth: document.documentElement.scrollWidth, viewWidth: window.innerWidth,
    cards: document.querySelectorAll('.card').length, links: links.length,
    broken: links.filter(function (a) { return !document.getElementById(a.getAttribute('href').slice(1)); }).length,
    chains: document.querySelectorAll('.card .toks a.t').length
  };
  document.body.setAttribute('data-probe', JSON.stringify(probe));
}, 300); });
</script>"""


def test_circuit_cards_page_links_every_node(tiny):
    if browser.chromium() is None:
        if ON_CI:
            pytest.fail("chromium is missing on CI: scripts/test.sh installs Debian's chromium package")
        pytest.skip("chromium is not installed (apt-get install chromium); CI installs it and runs this test")
    from capinterp.localizers.knowledge_circuit import KnowledgeCircuit

    facts = [
        ci.Example("Rome is the capital of", " Italy", {"subject": "Rome"}),
        ci.Example("Berlin is the capital of", " Germany", {"subject": "Berlin"}),
    ]
    kc = KnowledgeCircuit(tiny, algorithm="eap", top_n=30, progress=False).fit(facts)
    texts = ["The cat sat on the mat.", "<b>bold</b> & 'quotes'", "Rome is in Italy."]
    cards = ci.describe(tiny, kc, texts, task=facts, top=3, k=2, progress=False)
    OUT.mkdir(parents=True, exist_ok=True)
    path = cards.save(OUT / "circuit_cards.html")
    source = path.read_text(encoding="utf-8")
    cut = source.rfind("</body>")
    path.write_text(source[:cut] + CIRCUIT_PROBE + source[cut:], encoding="utf-8")
    page = browser.open_page(path, OUT / "circuit_cards.png")
    m = re.search(r'data-probe="([^"]*)"', page.dom)
    probe = json.loads(html.unescape(m.group(1))) if m else {}
    assert probe, "the page's scripts did not run to the end (no probe in the DOM)"
    assert not page.console, page.console
    assert probe["pageWidth"] <= probe["viewWidth"], probe
    assert probe["cards"] == len(cards) > 3 and probe["broken"] == 0
    assert probe["chains"] == sum(len(c.details["node_cards"]) for c in cards if c.kind == "path") > 0
    assert page.ink() > 0.02


# Expert cards: each card draws its routing section (frequency, top routed tokens by count and by rate).
EXPERT_PROBE = """<script>
window.addEventListener('load', function () { setTimeout(function () {
  var labels = Array.from(document.querySelectorAll('.card .label')).map(function (l) { return l.textContent; });
  var probe = {
    pageWidth: document.documentElement.scrollWidth, viewWidth: window.innerWidth,
    cards: document.querySelectorAll('.card').length, focus: document.querySelectorAll('.tok.focus').length,
    routing: labels.filter(function (t) { return t === 'routing'; }).length,
    routedTokens: document.querySelectorAll('.card .toks span.t small').length
  };
  document.body.setAttribute('data-probe', JSON.stringify(probe));
}, 300); });
</script>"""


def test_expert_cards_page_draws_routing(tiny):
    if browser.chromium() is None:
        if ON_CI:
            pytest.fail("chromium is missing on CI: scripts/test.sh installs Debian's chromium package")
        pytest.skip("chromium is not installed (apt-get install chromium); CI installs it and runs this test")
    from moe_tiny import load_tiny_moe

    model = load_tiny_moe("qwen2_moe")[0]
    texts = ["The cat sat on the mat.", "1+2=3 and 4+5=9", "<b>bold</b> & 'quotes'", "Rome is in Italy."]
    units = ci.KeySet([(0, 1), (1, 2), (1, "shared")], "expert")
    cards = ci.describe(model, units, texts, task=ci.data.arithmetic(ops="+", n=3), k=3, progress=False)
    OUT.mkdir(parents=True, exist_ok=True)
    path = cards.save(OUT / "expert_cards.html")
    source = path.read_text(encoding="utf-8")
    cut = source.rfind("</body>")
    path.write_text(source[:cut] + EXPERT_PROBE + source[cut:], encoding="utf-8")
    page = browser.open_page(path, OUT / "expert_cards.png")
    m = re.search(r'data-probe="([^"]*)"', page.dom)
    probe = json.loads(html.unescape(m.group(1))) if m else {}
    assert probe, "the page's scripts did not run to the end (no probe in the DOM)"
    assert not page.console, page.console
    assert probe["pageWidth"] <= probe["viewWidth"], probe
    assert probe["cards"] == probe["routing"] == len(cards) == 3
    assert probe["focus"] == sum(len(c.contexts) for c in cards) > 0
    shown = sum(len(c.details["by_count"]) + len(c.details["by_rate"]) for c in cards)
    assert probe["routedTokens"] == shown > 0
    assert page.ink() > 0.02


# Head cards: each top context's attention strip (weights as background, destination outlined).
HEAD_PROBE = """<script>
window.addEventListener('load', function () { setTimeout(function () {
  var strips = Array.from(document.querySelectorAll('.card .attn .snip'));
  var probe = {
    pageWidth: document.documentElement.scrollWidth, viewWidth: window.innerWidth,
    cards: document.querySelectorAll('.card').length, focus: document.querySelectorAll('.tok.focus').length,
    strips: strips.length,
    stripFocus: strips.filter(function (s) { return s.querySelectorAll('.tok.focus').length === 1; }).length,
    coloured: strips.filter(function (s) { return Array.from(s.querySelectorAll('.tok')).some(function (t) {
      return !/rgba\\(\\d+, \\d+, \\d+, 0\\)/.test(getComputedStyle(t).backgroundColor); }); }).length,
    sources: document.querySelectorAll('.card .toks.src span.t').length
  };
  document.body.setAttribute('data-probe', JSON.stringify(probe));
}, 300); });
</script>"""


def test_head_cards_page_draws_attention_strips(tiny):
    if browser.chromium() is None:
        if ON_CI:
            pytest.fail("chromium is missing on CI: scripts/test.sh installs Debian's chromium package")
        pytest.skip("chromium is not installed (apt-get install chromium); CI installs it and runs this test")
    texts = ["The cat sat on the mat.", "1+2=3 and 4+5=9", "<b>bold</b> & 'quotes'", "Rome is in Italy."]
    units = ci.KeySet([(0, 1), (2, 3), (3, 0)], "head")
    cards = ci.describe(tiny, units, texts, task=ci.data.arithmetic(ops="+", n=3), k=3, progress=False)
    OUT.mkdir(parents=True, exist_ok=True)
    path = cards.save(OUT / "head_cards.html")
    source = path.read_text(encoding="utf-8")
    cut = source.rfind("</body>")
    path.write_text(source[:cut] + HEAD_PROBE + source[cut:], encoding="utf-8")
    page = browser.open_page(path, OUT / "head_cards.png")
    m = re.search(r'data-probe="([^"]*)"', page.dom)
    probe = json.loads(html.unescape(m.group(1))) if m else {}
    assert probe, "the page's scripts did not run to the end (no probe in the DOM)"
    assert not page.console, page.console
    assert probe["pageWidth"] <= probe["viewWidth"], probe
    assert probe["cards"] == len(cards) == 3
    n_strips = sum(len(c.details["attention"]) for c in cards)
    assert probe["strips"] == probe["stripFocus"] == probe["coloured"] == n_strips == 9
    assert probe["focus"] == sum(len(c.contexts) for c in cards) + n_strips
    assert probe["sources"] == sum(len(c.details["sources"]) for c in cards) > 0
    assert page.ink() > 0.02
