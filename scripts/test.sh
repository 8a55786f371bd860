#!/usr/bin/env bash
# Sets the machine up, then runs the whole test suite as root with real BPF.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest "$@"
