#!/usr/bin/env bash
# The linters, run by scripts/test.sh before the tests (any finding fails it): ruff's lint
# and format check on the Python, mypy on the package, clang-format on the C.
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/ruff check src tests bench scripts
.venv/bin/ruff format --check --quiet src tests bench scripts
mypy --no-error-summary
git ls-files -z '*.c' '*.h' | xargs -0 clang-format --dry-run --Werror
