#!/usr/bin/env bash
# Build the documentation site into site/ with mkdocs in strict mode: any warning (a broken link,
# an unresolvable cross-reference, a docstring griffe cannot read) fails the build.
# Sets up .venv (scripts/setup.sh) when it is missing, and installs the pinned `docs` extra into it
# when mkdocs is missing. Extra arguments go to `mkdocs build`.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
  bash scripts/setup.sh
fi
bash scripts/docs_deps.sh
export NO_MKDOCS_2_WARNING=1   # silence mkdocs-material's banner about its successor
exec .venv/bin/python -m mkdocs build --strict --site-dir site "$@"
