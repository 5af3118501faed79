"""Write the family x method matrix into docs/models.md by running every family check.

    .venv/bin/python scripts/gen_family_table.py           # rewrite the block in docs/models.md
    .venv/bin/python scripts/gen_family_table.py --check   # exit 1 if the block is stale

Every cell comes from running ``capinterp.testing.family_checks`` on the family's tiny random
model against plain transformers; nothing in the table is typed by hand.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's capinterp, whatever the installed one is

from capinterp.testing.family_checks.table import BEGIN, END, matrix, render  # noqa: E402

DOC = ROOT / "docs" / "models.md"


def replace_block(text: str, table: str) -> str:
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{DOC} has no {BEGIN} ... {END} block")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{table}{END}{tail}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report whether docs/models.md is current")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    table = render(matrix())  # minutes of checks first: docs/models.md is read after them, edits made meanwhile kept
    new = replace_block(DOC.read_text(), table)
    if args.check:
        stale = new != DOC.read_text()
        print("docs/models.md family matrix is " + ("STALE: run scripts/gen_family_table.py" if stale else "current"))
        return int(stale)
    DOC.write_text(new)
    print(f"wrote the family matrix into {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
