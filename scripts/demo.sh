#!/usr/bin/env bash
# Sets the machine up, then traces the bundled leaky demo program from its start.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
mkdir -p build
# As distributions build: -O2, no frame pointers (stacks come from .eh_frame).
gcc -O2 -g -pthread -o build/leaky-demo scripts/demo/leaky.c
exec .venv/bin/leaktrace -c build/leaky-demo 2 --top 5
