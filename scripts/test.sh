#!/usr/bin/env bash
# Set up .venv (pinned, CPU torch) and run every test, the real-model (slow) ones included.
# Pass pytest arguments through, e.g. `bash scripts/test.sh -m "not slow"` for the fast suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export CAPINTERP_THREADS=${CAPINTERP_THREADS:-1}
exec .venv/bin/python -m pytest "${@:--q}"
