#!/usr/bin/env bash
# Set up .venv (pinned, CPU torch) and run everything CI checks:
#   0. ruff (lint + format check) and mypy over the package;
#   1. every test, the real-model (slow) ones included;
#   2. the quick reproduction of every paper experiment on the embedded model
#      (`capinterp reproduce --quick`, exits nonzero when any experiment fails; ~4 min);
#   3. notebooks 01-05, executed top to bottom (nbmake; the committed outputs are not rewritten);
#   4. the documentation build (mkdocs --strict: broken references fail).
# With arguments, only pytest runs, with them: `bash scripts/test.sh -m "not slow"` is the fast suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export CAPINTERP_THREADS=${CAPINTERP_THREADS:-1}
# The evaluation data (CI clones the repository with shared/ beside it); the package never looks
# for it by itself, so name it here for the quick reproduction and the notebooks.
if [ -z "${CAPINTERP_DATA:-}" ] && [ -d ../shared/data ]; then export CAPINTERP_DATA="$(cd ../shared/data && pwd)"; fi
if [ $# -gt 0 ]; then
  exec .venv/bin/python -m pytest "$@"
fi
step() { echo "== $1 ($(date +%H:%M:%S))"; }
step "lint and types (ruff, mypy)"
.venv/bin/ruff check capinterp tests benchmarks scripts
.venv/bin/ruff format --check capinterp tests benchmarks scripts
.venv/bin/mypy capinterp
step "tests"
.venv/bin/python -m pytest -q tests
step "quick reproduction"
CAPINTERP_THREADS=${CAPINTERP_NB_THREADS:-2} .venv/bin/capinterp reproduce --quick --fresh --out out/ci-quick
step "notebooks"
CAPINTERP_THREADS=${CAPINTERP_NB_THREADS:-2} .venv/bin/python -m pytest -q -p no:cacheprovider --nbmake --nbmake-timeout=900 --durations=0 \
  notebooks/*.ipynb
step "docs"
bash scripts/docs.sh
step "done"
