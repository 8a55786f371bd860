#!/usr/bin/env bash
# The linters, run by scripts/test.sh before the tests (any finding fails it): ruff's lint
# and format check on the Python, mypy on the package (--strict on the parsers of what a
# target controls), clang-format on the C.
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/ruff check src tests bench scripts
.venv/bin/ruff format --check --quiet src tests bench scripts
mypy --no-error-summary
# The modules that read what a target controls (its memory, heap, files, maps, dumps): mypy --strict.
mypy --strict --follow-imports=silent --no-error-summary \
    src/leaktrace/reachability/glibc_heap.py src/leaktrace/reachability/heap_graph.py \
    src/leaktrace/platform/{elf,process,freeze,ptrace,target_files,module_files}.py \
    src/leaktrace/unwind/tables.py src/leaktrace/sources/preload/{table,trace}.py \
    src/leaktrace/android/{records,heap_dump,leak_info,options}.py
git ls-files -z '*.c' '*.h' | xargs -0 clang-format --dry-run --Werror
