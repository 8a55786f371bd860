#!/usr/bin/env bash
# Sets the machine up, then traces the bundled leaky demo program from its start.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
mkdir -p build
gcc -O0 -g -fno-omit-frame-pointer -pthread -o build/leaky-demo scripts/demo/leaky.c
exec .venv/bin/leaktrace -c build/leaky-demo 2 --top 5
