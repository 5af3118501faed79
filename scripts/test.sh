#!/usr/bin/env bash
# Set up .venv (pinned, CPU torch) and run everything CI checks:
#   1. every test, the real-model (slow) ones included;
#   2. notebooks 01-02, executed top to bottom (nbmake); 03-05 are run by scripts/run_notebooks.py;
#   3. the documentation build (mkdocs --strict: broken references fail).
# The quick reproduction (`capinterp reproduce --quick`) is not yet part of CI.
# With arguments, only pytest runs, with them: `bash scripts/test.sh -m "not slow"` is the fast suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export CAPINTERP_THREADS=${CAPINTERP_THREADS:-1}
if [ $# -gt 0 ]; then
  exec .venv/bin/python -m pytest "$@"
fi
step() { echo "== $1 ($(date +%H:%M:%S))"; }
step "tests"
.venv/bin/python -m pytest -q tests
step "notebooks"
CAPINTERP_THREADS=${CAPINTERP_NB_THREADS:-2} .venv/bin/python -m pytest -q -p no:cacheprovider --nbmake --nbmake-timeout=900 \
  notebooks/01_quickstart.ipynb notebooks/02_comparing_localizers.ipynb
step "docs"
bash scripts/docs.sh
step "done"
