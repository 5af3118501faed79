#!/usr/bin/env bash
# Install the pinned `docs` extra (mkdocs, mkdocstrings, material) into .venv where it is missing.
# Used by scripts/docs.sh (the site build) and scripts/test.sh (tests/test_new_localizer.py builds
# the site in a copy of the tree).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! .venv/bin/python -c "import mkdocs, mkdocstrings_handlers.python, material" 2>/dev/null; then
  .venv/bin/python -m pip install -q -c constraints.txt -e ".[docs]"
fi
