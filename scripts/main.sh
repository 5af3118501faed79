#!/usr/bin/env bash
# Set up .venv, then run the main job on the embedded default model (Gemma 3 270M):
# arithmetic data -> evaluate -> CNL capability neurons -> heatmap HTML in out/.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/capinterp main --threads "${CAPINTERP_THREADS:-2}" "$@"
