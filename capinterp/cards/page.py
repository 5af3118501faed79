"""The cards page: one offline HTML file, a summary table and a card per unit.

No script or style is loaded from anywhere: the page is one file with its CSS and a few lines of
JavaScript (the summary table sorts by a click on a column head) inline. Each card shows the
unit's top contexts as token-highlighted snippets (a token's background is its activation: orange
above zero, blue below, scaled by the card's largest |activation|; the focus token is outlined;
hovering a token shows its value), the tokens its value vector promotes and suppresses, its
activation statistics with a small inline-SVG histogram, its specificity against the chance level,
its attribution score and its ablation effect. Every text (tokens, metadata) is HTML-escaped.
:meth:`capinterp.cards.Cards.save` writes it atomically.
"""

from __future__ import annotations

import html
import math
from typing import Any

__all__ = ["render"]

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:16px;color:#222;max-width:1360px}
h1{font-size:20px;margin:0 0 4px} .meta{color:#555;font-size:13px;margin-bottom:12px}
table{border-collapse:collapse;font-size:13px} td,th{padding:3px 8px;border-bottom:1px solid #ddd;text-align:left}
table.sortable th{cursor:pointer;background:#f3f3f6;user-select:none;white-space:nowrap}
table.sortable th:after{content:' \\2195';color:#999} td.num{text-align:right;font-variant-numeric:tabular-nums}
.table-wrap{overflow-x:auto;margin-bottom:16px}
.cards{display:flex;flex-wrap:wrap;gap:12px}
.card{border:1px solid #ccc;border-radius:6px;padding:10px;width:640px;box-sizing:border-box;background:#fff}
.card h2{font-size:16px;margin:0 0 6px} .row{display:flex;gap:16px;flex-wrap:wrap;font-size:12px}
.snip{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12px;margin:2px 0;white-space:pre-wrap;
 word-break:break-all;line-height:1.7}
.snip .act{color:#555;display:inline-block;min-width:56px}
.tok{border-radius:2px;padding:0 1px} .focus{outline:2px solid #000;outline-offset:0}
.toks span.t{display:inline-block;background:#eef;border-radius:3px;padding:0 4px;margin:1px;font-family:monospace}
.toks.sup span.t{background:#fee} .stats td{padding:1px 6px;border:none}
.label{font-weight:600;font-size:12px;margin-top:6px}
"""

SCRIPT = """
document.querySelectorAll('table.sortable th').forEach(function (th, col) {
  th.addEventListener('click', function () {
    var body = th.closest('table').tBodies[0], rows = Array.from(body.rows);
    var up = th.getAttribute('data-dir') !== 'asc';
    th.setAttribute('data-dir', up ? 'asc' : 'desc');
    function key(r) { var v = r.cells[col].getAttribute('data-v'), n = parseFloat(v);
      return v === '' ? null : (isNaN(n) ? v : n); }
    rows.sort(function (a, b) {
      var x = key(a), y = key(b);
      if (x === null || y === null) { return (x === null) - (y === null); }
      var c = (typeof x === 'number' && typeof y === 'number') ? x - y : String(x).localeCompare(String(y));
      return up ? c : -c;
    });
    rows.forEach(function (r) { body.appendChild(r); });
  });
});
"""

_e = html.escape


def _num(v: Any, fmt: str = ".3g") -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "–"
    return format(float(v), fmt)


def _show_token(t: str) -> str:
    """A token as visible text: newlines and tabs drawn as symbols, then escaped."""
    return _e(str(t).replace("\n", "\u23ce").replace("\t", "\u21e5"))


def _bg(v: float, scale: float) -> str:
    a = 0.0 if scale <= 0 or not math.isfinite(v) else min(1.0, abs(v) / scale)
    rgb = "255,140,0" if v >= 0 else "60,120,255"
    return f"background:rgba({rgb},{a * 0.85:.2f})"


def snippet(context: Any, scale: float) -> str:
    """One context as a line of highlighted tokens; the focus token outlined."""
    parts = []
    for i, (t, v) in enumerate(zip(context.tokens, context.values)):
        cls = "tok focus" if i == context.focus else "tok"
        parts.append(f'<span class="{cls}" style="{_bg(float(v), scale)}" title="{_num(v)}">{_show_token(t)}</span>')
    return f'<div class="snip"><span class="act">{_num(context.activation)}</span>{"".join(parts)}</div>'


def histogram_svg(stats: Any, colour: str = "#888", width: int = 180, height: int = 40) -> str:
    """The activation histogram as a small inline SVG (bars scaled to the tallest), with its range."""
    edges, counts = stats.histogram
    counts = [int(c) for c in counts]
    if not counts or max(counts) == 0:
        return ""
    w, top = width / len(counts), max(counts)
    bars = "".join(
        f'<rect x="{i * w:.1f}" y="{height - height * c / top:.1f}" width="{max(w - 1, 1):.1f}" '
        f'height="{height * c / top:.1f}" fill="{colour}"/>'
        for i, c in enumerate(counts)
    )
    return (
        f'<svg width="{width}" height="{height + 12}" role="img"><title>activation histogram</title>{bars}'
        f'<text x="0" y="{height + 11}" font-size="9">{_num(edges[0])}</text>'
        f'<text x="{width}" y="{height + 11}" font-size="9" text-anchor="end">{_num(edges[-1])}</text></svg>'
    )


def _stats_block(name: str, stats: Any, colour: str) -> str:
    if stats is None:
        return ""
    q = dict(stats.quantiles)
    qs = ", ".join(f"q{float(k) * 100:g} {_num(v)}" for k, v in sorted(q.items()))
    rows = [
        ("tokens", f"{int(stats.count)}"),
        ("mean ± std", f"{_num(stats.mean)} ± {_num(stats.std)}"),
        ("min / max", f"{_num(stats.min)} / {_num(stats.max)}"),
        ("share > 0", _num(stats.frac_positive, ".2f")),
        ("quantiles", qs),
    ]
    table = "".join(f"<tr><td>{_e(k)}</td><td>{_e(v)}</td></tr>" for k, v in rows)
    return f'<div><div class="label">{_e(name)}</div>{histogram_svg(stats, colour)}<table class="stats">{table}</table></div>'


def _token_list(title: str, rows: Any, cls: str) -> str:
    items = "".join(f'<span class="t" title="{_num(e)}">{_show_token(t)}</span>' for t, _, e in rows)
    return f'<div class="label">{_e(title)}</div><div class="toks {cls}">{items}</div>'


def _facts(card: Any) -> str:
    facts = []
    if card.score is not None:
        facts.append(f"score {_num(card.score)}")
    if card.specificity is not None:
        chance = f" (chance q95 {_num(card.chance['q95'])}, n={card.chance['n']})" if card.chance else ""
        facts.append(f"specificity {_num(card.specificity)}{chance}")
    if card.ablation is not None:
        a = card.ablation
        facts.append(
            f"ablated: Δp(target) {_num(a['delta_prob'], '+.3g')}, Δaccuracy {_num(a['delta_accuracy'], '+.3g')}"
        )
    return f'<div class="row">{"".join(f"<span>{_e(f)}</span>" for f in facts)}</div>'


def card_html(card: Any, i: int) -> str:
    """One unit's card."""
    scale = max((abs(float(v)) for c in card.contexts for v in c.values), default=0.0)
    parts = [f'<div class="card" id="card-{i}"><h2>{_e(card.label)}</h2>', _facts(card)]
    if card.contexts:
        parts.append('<div class="label">top contexts (activation, then the tokens; focus outlined)</div>')
        parts += [snippet(c, scale) for c in card.contexts]
    if card.effect is not None:
        parts.append(_token_list("promotes", card.effect.promoted, "pro"))
        parts.append(_token_list("suppresses", card.effect.suppressed, "sup"))
        parts.append(f'<div class="meta">{_e(card.effect.definition)}</div>')
    parts.append(details_html(card))
    stats = _stats_block("on the corpus", card.stats, "#888") + _stats_block("on the task", card.task_stats, "#e08a00")
    parts.append(f'<div class="row">{stats}</div></div>')
    return "".join(parts)


#: Unit kind -> "module:function" drawing that kind's ``card.details`` as HTML (imported when used).
DETAIL_SECTIONS: dict[str, str] = {
    "expert": "capinterp.cards.experts:expert_details_html",
    "head": "capinterp.cards.heads:head_details_html",
    "path": "capinterp.cards.circuits:circuit_section",
    "node": "capinterp.cards.circuits:circuit_section",
}


def details_html(card: Any) -> str:
    """The kind-specific sections of a card (``card.details``), or nothing for a kind without them."""
    import importlib

    where = DETAIL_SECTIONS.get(card.kind)
    if not where or not card.details:
        return ""
    module, name = where.split(":")
    return str(getattr(importlib.import_module(module), name)(card))


HEADS = [
    "#",
    "unit",
    "kind",
    "score",
    "top tokens",
    "promotes",
    "specificity",
    "chance q95",
    "Δp ablated",
    "Δacc ablated",
]
TITLES = [
    "rank in the input",
    "the unit",
    "neuron or layer",
    "attribution score from the input (NeuronScores / localizer)",
    "the focus tokens of the top contexts",
    "top promoted tokens through the unembedding",
    "(task mean - corpus mean) / corpus std",
    "95th percentile of the specificity of random neurons of the same layer",
    "change of mean p(target) with only this unit erased",
    "change of accuracy with only this unit erased",
]


def _cell(v: Any, text: str | None = None, numeric: bool = False) -> str:
    sort = "" if v is None else (_num(v, ".6g") if numeric else str(v))
    cls = ' class="num"' if numeric else ""
    return f'<td{cls} data-v="{_e(sort)}">{_e(text if text is not None else ("–" if v is None else str(v)))}</td>'


def summary_table(cards: Any) -> str:
    """The sortable header table: a row per card, linking to it."""
    heads = "".join(f'<th title="{_e(t)}">{_e(h)}</th>' for h, t in zip(HEADS, TITLES))
    rows = []
    for i, c in enumerate(cards):
        abl = c.ablation or {}
        cells = [
            _cell(i, str(i + 1), numeric=True),
            f'<td data-v="{_e(c.label)}"><a href="#card-{i}">{_e(c.label)}</a></td>',
            _cell(c.kind),
            _cell(c.score, _num(c.score), numeric=True),
            _cell(" ".join(c.top_tokens[:5]), " ".join(repr(t) for t in c.top_tokens[:5])),
            _cell(" ".join(c.promoted[:5]), " ".join(repr(t) for t in c.promoted[:5])),
            _cell(c.specificity, _num(c.specificity), numeric=True),
            _cell((c.chance or {}).get("q95"), _num((c.chance or {}).get("q95")), numeric=True),
            _cell(abl.get("delta_prob"), _num(abl.get("delta_prob"), "+.3g"), numeric=True),
            _cell(abl.get("delta_accuracy"), _num(abl.get("delta_accuracy"), "+.3g"), numeric=True),
        ]
        rows.append(f"<tr>{''.join(cells)}</tr>")
    return (
        f'<div class="table-wrap"><table class="sortable"><thead><tr>{heads}</tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table></div>"
    )


def _meta_line(meta: dict[str, Any]) -> str:
    shown = {k: v for k, v in meta.items() if not isinstance(v, (dict, list))}
    return "; ".join(f"{k}: {v}" for k, v in shown.items())


def render(cards: Any, *, full: bool = True, title: str = "capinterp unit cards") -> str:
    """The page of ``cards`` (a :class:`~capinterp.cards.Cards`): a full HTML document, or with
    ``full=False`` a fragment for a notebook (same content, no ``<html>`` shell)."""
    body = (
        f"<h1>{_e(title)}</h1><div class='meta'>{_e(_meta_line(cards.meta))}</div>"
        f"{summary_table(cards)}<div class='cards'>{''.join(card_html(c, i) for i, c in enumerate(cards))}</div>"
    )
    if not full:
        return f"<div><style>{CSS}</style>{body}<script>{SCRIPT}</script></div>"
    return (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{_e(title)}</title>'
        f"<style>{CSS}</style></head><body>{body}<script>{SCRIPT}</script></body></html>"
    )
