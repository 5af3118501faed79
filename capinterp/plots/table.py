"""HTML tables for reports (``capinterp reproduce``'s report.html): readable headers that explain
themselves, and a layout that never clips a wide table.

:func:`table_html` writes a DataFrame as a table inside a box that scrolls sideways when the table
is wider than the page (headers wrap first); each header is a readable name (``drop_random_mean``
-> "drop, random mean") with the column's meaning as its tooltip, and a "columns" list under the
table spells every meaning out. :data:`TABLE_CSS` styles it (include it once in the page's
``<style>``).
"""

from __future__ import annotations

import html
import re

import pandas as pd

__all__ = ["GLOSSARY", "TABLE_CSS", "column_help", "column_label", "table_html"]

TABLE_CSS = (
    ".table-wrap{overflow-x:auto;max-width:100%;margin:.5em 0}"
    ".table-wrap table{border-collapse:collapse;font-size:12px}"
    ".table-wrap td,.table-wrap th{border:1px solid #ccc;padding:2px 4px}"
    ".table-wrap td{white-space:nowrap;text-align:right}"
    ".table-wrap th{white-space:normal;min-width:4em;max-width:9em;vertical-align:bottom;background:#f3f5f7}"
    ".table-wrap th[title]{cursor:help;text-decoration:underline dotted #889}"
    "details.columns{font-size:13px;margin:.3em 0 1em}details.columns dt{font-weight:bold;display:inline}"
    "details.columns dd{display:inline;margin:0 0 0 .4em}details.columns dd:after{content:'';display:block}"
)

#: Readable name and meaning of the columns the experiments write (others are explained by their parts).
GLOSSARY: dict[str, tuple[str, str]] = {
    "ipp": (
        "IPP",
        "improvement over the best random control: the located set's drop minus the largest drop of any random set of the same size (positive: it beats every random draw)",
    ),
    "ipp_metric": ("IPP metric", "the metric IPP is measured with"),
    "iou": ("IoU", "intersection over union of the two sets"),
    "cmd": ("CMD", "circuit-model distance: how far the kept circuit's output is from the full model's (0: the same)"),
    "cpr": ("CPR", "circuit performance ratio: the kept circuit's performance over the full model's"),
    "base": ("base", "the metric on the unmodified model"),
    "located": ("located", "the metric with the located neurons erased (zeroed)"),
    "drop": ("drop", "base minus located: how much erasing the located set costs"),
    "drop_random_mean": (
        "drop, random mean",
        "base minus the metric with a random set of the same size erased, averaged over the random sets",
    ),
    "sigma": (
        "sigma",
        "selection threshold: neurons whose score is more than sigma standard deviations above the mean are kept",
    ),
    "ratio_pct": ("share of neurons, %", "the located neurons as a percentage of all FFN neurons"),
    "n_test": ("test examples", "held-out examples the metric is measured on"),
    "n_random": ("random sets", "random neuron sets of the same size drawn as the control"),
    "base_prob": ("base p(target)", "mean probability of the target token on the unmodified model"),
    "located_prob": ("located p(target)", "mean probability of the target token with the located neurons erased"),
    "neuron_pct": ("neurons, %", "located neurons as a percentage of all FFN neurons"),
    "param_share": ("share of parameters", "the located units' parameters as a share of the model's"),
    "p_value": ("p-value", "probability of an overlap at least this large between random sets of the same sizes"),
    "rel_change": ("relative change", "(after - before) / before"),
    "rel_drop": ("relative drop", "(before - after) / before"),
    "full": ("full model", "the metric on the full model"),
    "all_ablated": ("all ablated", "the metric with every unit ablated"),
    "pearson": ("Pearson r", "Pearson correlation of the two methods' scores"),
    "spearman": ("Spearman rho", "Spearman rank correlation of the two methods' scores"),
}
_PARTS = {
    "n": "number of",
    "pct": "%",
    "mean": "mean",
    "std": "standard deviation",
    "min": "min",
    "max": "max",
    "p05": "5th percentile",
    "p95": "95th percentile",
    "prob": "p(target)",
    "chance": "expected by chance",
    "acc": "accuracy",
}


def column_label(name: str) -> str:
    """The header shown for column ``name``: the glossary's name, else its words spelled out."""
    if name in GLOSSARY:
        return GLOSSARY[name][0]
    words = [w for w in re.split(r"_+", str(name)) if w]
    if len(words) > 1 and words[0] in ("random", "paper"):  # random_mean -> "random: mean"
        return f"{words[0]}: " + " ".join(GLOSSARY.get(w, (_PARTS.get(w, w), ""))[0] for w in words[1:])
    if words and words[0] == "n" and len(words) > 1:
        return "number of " + " ".join(words[1:])
    return " ".join(GLOSSARY.get(w, (_PARTS.get(w, w), ""))[0] for w in words) or str(name)


def column_help(name: str) -> str:
    """The meaning of column ``name`` (the tooltip), or "" when nothing more than its label is known."""
    if name in GLOSSARY:
        return GLOSSARY[name][1]
    words = [w for w in re.split(r"_+", str(name)) if w]
    if len(words) > 1 and words[0] == "random":
        rest = "_".join(words[1:])
        inner = GLOSSARY[rest][1] if rest in GLOSSARY else column_label(rest)
        return f"{inner}, over random sets of the same size (the control)"
    if len(words) > 1 and words[0] == "paper":
        rest = "_".join(words[1:])
        return f"the paper's reported value of {column_label(rest)}"
    if words and words[-1] == "chance":
        return f"{column_label('_'.join(words[:-1]))} expected between random sets of the same sizes"
    return ""


def table_html(df: pd.DataFrame, *, float_format: str = "{:.4g}") -> str:
    """``df`` as a scrollable table with explained headers and a "columns" list (see the module)."""
    heads = []
    for col in df.columns:
        label, tip = html.escape(column_label(str(col))), column_help(str(col))
        raw = html.escape(str(col))
        title = html.escape(f"{col}: {tip}" if tip else str(col), quote=True)
        heads.append(f'<th title="{title}" data-column="{raw}">{label}</th>')
    rows = []
    for rec in df.itertuples(index=False):
        cells = "".join(f"<td>{html.escape(_fmt(v, float_format))}</td>" for v in rec)
        rows.append(f"<tr>{cells}</tr>")
    explained = [
        f"<dt>{html.escape(column_label(str(c)))}</dt><dd>(<code>{html.escape(str(c))}</code>) {html.escape(column_help(str(c)))}</dd>"
        for c in df.columns
        if column_help(str(c))
    ]
    legend = (
        f"<details class='columns'><summary>columns</summary><dl>{''.join(explained)}</dl></details>"
        if explained
        else ""
    )
    return (
        f"<div class='table-wrap'><table><thead><tr>{''.join(heads)}</tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table></div>{legend}"
    )


def _fmt(value: object, float_format: str) -> str:
    if isinstance(value, float):
        return "" if value != value else float_format.format(value)
    return str(value)
