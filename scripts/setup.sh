#!/usr/bin/env bash
# Sets up a Debian 12 machine for leaktrace, as root; safe to run again.
#   scripts/setup.sh           what leaktrace needs to run (scripts/demo.sh):
#     - bcc (Debian's python3-bpfcc), gcc, binutils (readelf: unwind tables), llvm (llvm-symbolizer),
#       debuginfod's client, python3-protobuf (--pprof)
#     - musl-tools: musl-gcc builds the in-process library for musl programs (setup.py)
#     - kernel headers for bcc: the running kernel's, or the distro's default linked in
#     - tracefs at /sys/kernel/tracing
#     - the HTML page's flame graph library (d3, d3-flame-graph from the npm registry: scripts/web_assets.py)
#     - .venv (with system site packages, for bcc) holding leaktrace in editable mode
#   scripts/setup.sh --tests   the same, and what the tests and benches use (scripts/test.sh):
#     bpftool, g++, tmux, setpriv, podman and runc (the container tests), qemu, cpio, busybox-static
#     (the test VMs: scripts/vm.sh fetches their kernels into build/vm), the other allocators, redis,
#     libc6-dbg, golang-go (go tool pprof),
#     chromium (the HTML page), valgrind (the heap walk's oracle), debuginfod's server, mypy,
#     clang-format, heaptrack and memray (bench/), speedscope (npm, in build/: the folded stacks' reader),
#     debootstrap and a Debian 13 root in build/debian13 with its python3.13 (the Python frames' tests),
#     strace (a traced process refused), gcc-aarch64-linux-gnu and qemu-user-static (the library built for
#     aarch64 and run: test_arm64_library.py;
#     with qemu-system-arm, the arm64 test VM: scripts/vm.sh --arch arm64)
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" -ne 0 ]; then
    echo "setup.sh: run as root (it installs packages and mounts tracefs)" >&2
    exit 1
fi

arch=$(dpkg --print-architecture)
release=$(uname -r)
tests=0
[ "${1:-}" = "--tests" ] && tests=1
packages=(python3-bpfcc python3-venv python3-pip gcc libc6-dev musl-tools binutils python3-protobuf llvm debuginfod "linux-headers-$arch")
if [ $tests -eq 1 ]; then
    command -v npm >/dev/null 2>&1 || packages+=(npm)   # speedscope's; a machine's own Node.js is kept
    packages+=(bpfcc-tools bpftool g++ util-linux tmux podman runc qemu-system-x86 cpio busybox-static xz-utils zstd libjemalloc2 libjemalloc-dev libtcmalloc-minimal4 libmimalloc2.0 redis-server redis-tools libc6-dbg golang-go chromium mypy clang-format valgrind heaptrack prometheus automake autoconf meson cmake debootstrap gcc-aarch64-linux-gnu qemu-user-static qemu-system-arm strace)
fi

missing=()
for p in "${packages[@]}"; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
headers_exact=0
if [ ! -e "/lib/modules/$release/build/include" ]; then
    dpkg -s "linux-headers-$release" >/dev/null 2>&1 && headers_exact=1
fi
if [ ${#missing[@]} -gt 0 ] || { [ ! -e "/lib/modules/$release/build/include" ] && [ $headers_exact -eq 0 ]; }; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    [ ${#missing[@]} -gt 0 ] && apt-get install -y -q "${missing[@]}"
    if [ ! -e "/lib/modules/$release/build/include" ] && apt-cache show "linux-headers-$release" >/dev/null 2>&1; then
        apt-get install -y -q "linux-headers-$release"
    fi
fi

# bcc compiles against /lib/modules/$(uname -r)/{build,source}; without headers for this
# kernel, the distro's default ones serve (uprobe programs use no kernel-internal layout).
if [ ! -e "/lib/modules/$release/build/include" ]; then
    default=$(ls -d /lib/modules/*/build 2>/dev/null | grep -v "/$release/" | sort -V | tail -n 1 || true)
    if [ -z "$default" ]; then
        echo "setup.sh: no kernel headers found for $release nor a distro default" >&2
        exit 1
    fi
    default_dir=$(dirname "$default")
    mkdir -p "/lib/modules/$release"
    ln -sfn "$(readlink -f "$default_dir/build")" "/lib/modules/$release/build"
    ln -sfn "$(readlink -f "$default_dir/source")" "/lib/modules/$release/source"
    echo "setup.sh: no headers package for kernel $release; linked the distro's default headers ($(basename "$default_dir")) as its build and source"
fi

if [ ! -e /sys/kernel/tracing/uprobe_events ]; then
    mount -t tracefs nodev /sys/kernel/tracing
fi

# The HTML page's flame graph (d3-flame-graph on d3, from the npm registry), inlined into every page.
/usr/bin/python3 scripts/web_assets.py src/leaktrace/outputs/web

# speedscope (npm registry), for the tests only: its own parser reads the folded stacks in Chromium.
if [ $tests -eq 1 ] && [ ! -f build/speedscope/node_modules/speedscope/dist/release/index.html ]; then
    npm install --prefix build/speedscope --no-audit --no-fund --silent speedscope@1.25.0
fi

# Debian 13's CPython 3.13 in a root of its own (tests/python_interpreters.py): a registry's
# interpreter of a version Debian 12 lacks, traced in another mount namespace as a container's.
if [ $tests -eq 1 ] && [ ! -x build/debian13/usr/bin/python3.13 ]; then
    mkdir -p build && rm -rf build/debian13.partial
    debootstrap --variant=minbase --include=python3.13 trixie build/debian13.partial http://deb.debian.org/debian >/dev/null
    mv build/debian13.partial build/debian13
fi

if [ ! -x .venv/bin/python ]; then
    /usr/bin/python3 -m venv --system-site-packages .venv
fi
if [ $tests -eq 1 ]; then
    if ! .venv/bin/python -c 'import leaktrace.sources.preload.table as t, pytest, jsonschema, prometheus_client, tabulate, bcc, capstone, numpy, memray; t.preload_library()' >/dev/null 2>&1 || [ ! -x .venv/bin/ruff ]; then
        .venv/bin/pip install -q -e '.[test,bench]'
    fi
elif ! .venv/bin/python -c 'import leaktrace.sources.preload.table as t, prometheus_client, tabulate, bcc, capstone, numpy; t.preload_library()' >/dev/null 2>&1; then
    .venv/bin/pip install -q -e .
fi
