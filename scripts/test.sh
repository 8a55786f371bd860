#!/usr/bin/env bash
# Sets the machine up (with what the tests use), runs the linters (scripts/lint.sh), then the whole test suite as root with real BPF
# and a part of it in a test VM on Debian 12's 6.1 (arguments: passed to pytest instead; --kernel SERIES:
# the kernel subset in a test VM, scripts/vm.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --tests
# --kernel SERIES [pytest args]: the kernel subset (tests/integration/kernel_subset.txt, or the
# tests named) inside a test VM booting Debian's kernel of that series (5.10, 6.1, 6.12).
if [ "${1:-}" = "--kernel" ]; then
    series=${2:?--kernel needs a series: 5.10, 6.1 or 6.12}
    shift 2
    [ $# -gt 0 ] || set -- $(grep -v '^#' tests/integration/kernel_subset.txt)
    exec bash scripts/vm.sh --kernel "$series" -- .venv/bin/python -m pytest -p no:cacheprovider -q "$@"
fi
bash scripts/lint.sh
if [ $# -gt 0 ]; then
    exec .venv/bin/python -m pytest "$@"
fi
# The fast lane: the unit tests first (about a minute), as root and as a user who is not,
# then the root suite, then a part of the kernel subset on Debian 12's own kernel in a test VM.
.venv/bin/python -m pytest -q tests/unit
bash scripts/unit_as_user.sh
.venv/bin/python -m pytest tests/integration
exec bash scripts/vm.sh --kernel 6.1 -- .venv/bin/python -m pytest -p no:cacheprovider -v \
    $(grep -v '^#' tests/integration/kernel_ci.txt)
