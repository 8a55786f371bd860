#!/usr/bin/env bash
# Sets the machine up (with what the tests use), runs the linters (scripts/lint.sh), then the whole test suite as root with real BPF
# (arguments: passed to pytest instead).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --tests
bash scripts/lint.sh
if [ $# -gt 0 ]; then
    exec .venv/bin/python -m pytest "$@"
fi
# The fast lane: the unit tests first (about a minute), as root and as a user who is not,
# then the root suite.
.venv/bin/python -m pytest -q tests/unit
bash scripts/unit_as_user.sh
exec .venv/bin/python -m pytest tests/integration
