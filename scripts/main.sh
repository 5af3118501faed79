#!/usr/bin/env bash
# Set up .venv, then run the main job on the embedded default model (Gemma 3 270M):
# arithmetic data -> evaluate -> CNL capability neurons -> heatmap and cards page (HTML) in out/.
# stdout: exactly one JSON document (the summary; `bash scripts/main.sh > x.json` is valid JSON);
# set-up messages, progress and the "next:" hints go to stderr.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh >&2
exec .venv/bin/capinterp main --threads "${CAPINTERP_THREADS:-2}" "$@"
