#!/usr/bin/env bash
# The device check (see bench/gpu_check.py): one JSON document on stdout; exit 0 when every part ran.
#   bench/gpu_check.sh --backend cuda --llama-server PATH   on an NVIDIA machine (the governor observes only)
#   bench/gpu_check.sh --backend vulkan                      on Mesa's lavapipe (CI)
set -euo pipefail
cd "$(dirname "$0")/.."
exec "${PYTHON:-.venv/bin/python}" bench/gpu_check.py "$@"
