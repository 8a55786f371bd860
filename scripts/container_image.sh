#!/usr/bin/env bash
# Builds the image localhost/leaktrace:latest from this checkout, as root, with no registry
# pull: a Debian 12 root (debootstrap, cached in build/image-root) with bcc, the compiler bcc
# runs and the symbolizer, imported as localhost/leaktrace-base:bookworm; then podman build
# (scripts/Containerfile) installs leaktrace's wheel and its dependencies' from build/wheels.
# Run it with the host's pid namespace and the mounts docs/agent.md lists.
set -euo pipefail
cd "$(dirname "$0")/.."
podman=(podman --runtime runc)   # this kind of machine's cgroups are hybrid v1, which crun refuses
root=build/image-root
if [ ! -x "$root/usr/bin/python3" ]; then
    rm -rf "$root.partial" && mkdir -p build
    debootstrap --variant=minbase \
        --include=python3,python3-venv,python3-pip,python3-bpfcc,python3-protobuf,gcc,libc6-dev,binutils,llvm \
        bookworm "$root.partial" http://deb.debian.org/debian >/dev/null
    mv "$root.partial" "$root"
fi
if ! "${podman[@]}" image exists localhost/leaktrace-base:bookworm; then
    tar -C "$root" -c . | "${podman[@]}" import - localhost/leaktrace-base:bookworm >/dev/null
fi
rm -rf build/wheels
.venv/bin/pip wheel -q --wheel-dir build/wheels . "capstone>=5" numpy tabulate prometheus-client "protobuf>=3.20"
"${podman[@]}" build -q --network none -f scripts/Containerfile -t localhost/leaktrace:latest .
