"""The family x method matrix of docs/models.md, built by running every check (no typed cells)."""

from __future__ import annotations

__all__ = ["BEGIN", "END", "matrix", "render"]

BEGIN = "<!-- family-matrix:begin (scripts/gen_family_table.py writes this block) -->"
END = "<!-- family-matrix:end -->"


def matrix(families=None, methods=None) -> dict[tuple[str, str], str]:
    """``{(family, method): "Y" | "refused: ..." | "fails: ..."}`` for every pair."""
    from capinterp.testing.family_checks import FAMILIES, all_checks, run_check

    out: dict[tuple[str, str], str] = {}
    for family in families or FAMILIES:
        for method in methods or all_checks():
            try:
                out[family, method] = run_check(method, family)
            except Exception as err:  # a failing check is shown as such, and the tests fail on it
                out[family, method] = f"fails: {type(err).__name__}: {str(err).splitlines()[0][:160]}"
    return out


def render(cells: dict[tuple[str, str], str]) -> str:
    """Markdown: one row per family, one column per method; reasons once per family below the table."""
    families = list(dict.fromkeys(f for f, _ in cells))
    methods = list(dict.fromkeys(m for _, m in cells))
    lines = ["| family | " + " | ".join(methods) + " |", "|---|" + "---|" * len(methods)]
    notes: list[str] = []
    for fam in families:
        row = []
        for m in methods:
            cell = cells[fam, m]
            if cell == "Y":
                row.append("Y")
                continue
            kind, _, reason = cell.partition(": ")
            note = f"{fam}: {reason}"
            if note not in notes:
                notes.append(note)
            row.append(f"{kind} [{notes.index(note) + 1}]")
        lines.append(f"| {fam} | " + " | ".join(row) + " |")
    lines.append("")
    lines += [f"[{i}] {n}" + "  " for i, n in enumerate(notes, 1)]
    return "\n".join(lines).rstrip() + "\n"
