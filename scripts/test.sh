#!/usr/bin/env bash
# Set up .venv (pinned, CPU torch) and run everything CI checks:
#   0. ruff (lint + format check) and mypy over the package;
#   1. every test, the real-model (slow) ones included;
#   2. the quick reproduction of every paper experiment on the embedded model
#      (`capinterp reproduce --quick`, exits nonzero when any experiment fails), run beside step 1;
#   3. notebooks 01-05, executed top to bottom (nbmake; the committed outputs are not rewritten);
#   4. the documentation build (mkdocs --strict: broken references fail).
# With arguments, only pytest runs, with them: `bash scripts/test.sh -m "not slow"` is the fast suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/docs_deps.sh   # tests/test_new_localizer.py builds the site in a copy of the tree
export CAPINTERP_THREADS=${CAPINTERP_THREADS:-1}
# The browser test (tests/plots/test_browser.py) opens every page capinterp writes in Debian's
# chromium; install it once (quietly) where it is missing. On CI (CI=true) a failed install stops here.
if [ ! -x /usr/bin/chromium ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo -n"
  if $SUDO apt-get update -qq >/dev/null && $SUDO env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -qq chromium >/dev/null; then echo "installed chromium (for the browser test)"
  elif [ "${CI:-}" = true ]; then echo "could not install chromium (apt-get install chromium)" >&2; exit 1
  else echo "chromium is not installed: the browser test will be skipped" >&2; fi
fi
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
# The test suite runs one thread; the quick reproduction runs beside it on the other core
# (one thread too), so the two longest steps share the wall clock instead of adding up.
step "quick reproduction (in the background) and tests"
mkdir -p out
CAPINTERP_THREADS=1 .venv/bin/capinterp reproduce --quick --fresh --out out/ci-quick >out/ci-quick.log 2>&1 &
REPRO=$!
trap 'kill $REPRO 2>/dev/null || true' EXIT
.venv/bin/python -m pytest -q tests
step "waiting for the quick reproduction"
if wait $REPRO; then REPRO_RC=0; else REPRO_RC=$?; fi
trap - EXIT
tail -n 40 out/ci-quick.log
if [ "$REPRO_RC" -ne 0 ]; then echo "quick reproduction failed (exit $REPRO_RC): full log in out/ci-quick.log"; exit "$REPRO_RC"; fi
step "notebooks"
CAPINTERP_THREADS=${CAPINTERP_NB_THREADS:-2} .venv/bin/python -m pytest -q -p no:cacheprovider --nbmake --nbmake-timeout=900 --durations=0 \
  notebooks/*.ipynb
step "docs"
bash scripts/docs.sh
step "done"
