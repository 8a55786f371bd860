#!/usr/bin/env bash
# Sets the machine up (with what the tests use), runs the linters (scripts/lint.sh), then the whole test suite as root with real BPF.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --tests
bash scripts/lint.sh
exec .venv/bin/python -m pytest "$@"
