#!/usr/bin/env bash
# Set up .venv (pinned, CPU torch) and run everything CI checks:
#   0. ruff (lint + format check) and mypy over the package;
#   1. every test, the real-model (slow) ones included;
#   2. the quick reproduction of every paper experiment on the embedded model
#      (`capinterp reproduce --quick`, exits nonzero when any experiment fails);
#   3. notebooks 01-05, executed top to bottom (nbmake; the committed outputs are not rewritten);
#   4. the documentation build (mkdocs --strict: broken references fail).
# Steps 0, 2 and notebooks 02, 03, 05 run in a second lane beside the tests (see "lane B" below).
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
# Two lanes share the two cores, one thread each, so the long steps share the wall clock:
#   lane A (here): the test suite, the documentation build, then notebooks 01 and 04;
#   lane B (in the background): lint and types, the quick reproduction, then notebooks 03, 05, 02.
# Each lane-B step logs to out/ci-*.log and records its exit status; every failure fails the run.
mkdir -p out
rm -f out/ci-*.rc
notebooks() {  # notebooks by number, executed top to bottom (nbmake; committed outputs are not rewritten)
  local files=()
  for n in "$@"; do files+=(notebooks/"$n"_*.ipynb); done
  CAPINTERP_THREADS=${CAPINTERP_NB_THREADS:-1} .venv/bin/python -m pytest -q -p no:cacheprovider --nbmake \
    --nbmake-timeout=900 --durations=0 "${files[@]}"
}
lane() {  # lane() NAME COMMAND...: run a lane-B step into out/ci-NAME.log, its exit status into out/ci-NAME.rc
  local name=$1; shift
  echo "== $name ($(date +%H:%M:%S))" >"out/ci-$name.log"
  if "$@" >>"out/ci-$name.log" 2>&1; then echo 0 >"out/ci-$name.rc"; else echo $? >"out/ci-$name.rc"; fi
}
lint() {
  .venv/bin/ruff check capinterp tests benchmarks scripts && .venv/bin/ruff format --check capinterp tests benchmarks scripts \
    && .venv/bin/mypy capinterp
}
step "lane B in the background: lint and types, quick reproduction, notebooks 03 05 02"
(
  lane lint lint
  lane quick env CAPINTERP_THREADS=1 .venv/bin/capinterp reproduce --quick --fresh --out out/ci-quick
  lane notebooks-b notebooks 03 05 02
) &
LANE_B=$!
trap 'pkill -P $LANE_B 2>/dev/null; kill $LANE_B 2>/dev/null || true' EXIT
step "tests"
.venv/bin/python -m pytest -q --durations=40 tests   # the 40 slowest, to keep CI time in check
step "docs"
bash scripts/docs.sh
step "notebooks 01 04"
notebooks 01 04
step "waiting for lane B"
wait $LANE_B || true
trap - EXIT
FAILED=0
for name in lint quick notebooks-b; do
  rc=$(cat "out/ci-$name.rc" 2>/dev/null || echo missing)
  echo "== lane B: $name (exit $rc): the end of out/ci-$name.log"
  tail -n 40 "out/ci-$name.log" 2>/dev/null || true
  [ "$rc" = 0 ] || FAILED=1
done
if [ "$FAILED" -ne 0 ]; then echo "a lane-B step failed: see above and out/ci-*.log"; exit 1; fi
step "done"
