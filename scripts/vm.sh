#!/usr/bin/env bash
# Runs COMMAND as root in a test VM booting one of Debian's own kernels, and exits with its status:
#   scripts/vm.sh [--arch x86_64|arm64] [--kernel 5.10|6.1|6.12] [--memory MiB] -- COMMAND...
# 5.10: bullseye's kernel package, 6.1: bookworm's, 6.12: trixie's, fetched with apt from
# Debian's archive (lists and packages in build/vm/, not the machine's own) with the headers
# bcc compiles against. The guest's root is this machine's, read-only through 9p under a tmpfs
# overlay: the checkout is there at the same path as it is at the call (build/ included), so
# .venv/bin/leaktrace and the tests run unchanged; what the guest writes is gone at its end,
# but for the directory the run's status goes to. COMMAND runs in the checkout's root;
# its output is this script's. qemu runs under TCG (nested KVM does not boot on these
# machines); LEAKTRACE_VM_ACCEL=kvm asks for KVM. LEAKTRACE_VM_TIMEOUT (seconds, default
# 5400) bounds the whole run.
# --arch arm64: Debian's arm64 kernel under qemu-system-aarch64 (TCG, always), and for a root a
# Debian 12 arm64 one that debootstrap makes once in build/vm/arm64/root (its second stage run by
# qemu-user-static through binfmt_misc), read-only under a tmpfs overlay. The checkout is shared
# on its own, at the same path, under an overlay too; its .venv there is an arm64 one, made at
# each run with the checkout's package installed in place (the x86-64 one is left as it is).
set -euo pipefail
cd "$(dirname "$0")/.."
top=$(pwd)
arch=x86_64 series=6.1 memory=4096
while [ $# -gt 0 ]; do
    case "$1" in
    --arch) arch=$2; shift 2 ;;
    --kernel) series=$2; shift 2 ;;
    --memory) memory=$2; shift 2 ;;
    --) shift; break ;;
    *) echo "vm.sh: unknown option '$1' (usage: vm.sh [--arch x86_64|arm64] [--kernel 5.10|6.1|6.12] -- COMMAND...)" >&2; exit 2 ;;
    esac
done
[ $# -gt 0 ] || { echo "vm.sh: no COMMAND (usage: vm.sh [--kernel 5.10|6.1|6.12] -- COMMAND...)" >&2; exit 2; }
case "$series" in
5.10) suite=bullseye ;;
6.1) suite=bookworm ;;
6.12) suite=trixie ;;
*) echo "vm.sh: no kernel series '$series': 5.10 (bullseye), 6.1 (bookworm) or 6.12 (trixie)" >&2; exit 2 ;;
esac
case "$arch" in
x86_64 | amd64) arch=x86_64 debian_arch=amd64 qemu=qemu-system-x86_64 dir=$top/build/vm/$suite ;;
arm64 | aarch64) arch=arm64 debian_arch=arm64 qemu=qemu-system-aarch64 dir=$top/build/vm/$suite-arm64 ;;
*) echo "vm.sh: no test VM for '$arch': x86_64 or arm64" >&2; exit 2 ;;
esac
for tool in "$qemu" cpio depmod modprobe dpkg-deb /bin/busybox; do
    command -v "$tool" >/dev/null || { echo "vm.sh: $tool is missing: run scripts/setup.sh --tests" >&2; exit 1; }
done

# arm64's root, once: debootstrap, its second stage run through binfmt_misc by qemu-user-static.
guest_root=/
if [ "$arch" = arm64 ]; then
    guest_root=$top/build/vm/arm64/root
    if [ ! -f "$guest_root/etc/leaktrace-root" ]; then
        [ -e /proc/sys/fs/binfmt_misc/register ] || mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
        [ -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ] || cat /usr/lib/binfmt.d/qemu-aarch64.conf >/proc/sys/fs/binfmt_misc/register
        rm -rf "$guest_root.partial"
        debootstrap --arch=arm64 --variant=minbase \
            --include=python3,python3-venv,python3-pip,python3-bpfcc,python3-protobuf,gcc,libc6-dev,binutils,busybox-static,kmod,procps,llvm,python3-pytest,python3-capstone,python3-tabulate,python3-numpy,python3-prometheus-client,python3-jsonschema,strace,python3-junitparser,g++,valgrind \
            bookworm "$guest_root.partial" http://deb.debian.org/debian >/dev/null
        touch "$guest_root.partial/etc/leaktrace-root"
        rm -rf "$guest_root" && mv "$guest_root.partial" "$guest_root"
    fi
fi

# The kernel, its modules and headers, once: apt with lists of the suite's own.
if [ ! -f "$dir/ready" ]; then
    apt_dir=$top/build/vm/apt/$suite-$debian_arch
    mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial" "$dir/debs"
    echo "deb [arch=$debian_arch] http://deb.debian.org/debian $suite main" >"$apt_dir/sources.list"
    : >"$apt_dir/status"
    apt=(-o "Dir::Etc::sourcelist=$apt_dir/sources.list" -o Dir::Etc::sourceparts=- -o "Dir::State::Lists=$apt_dir/lists"
        -o "Dir::Cache=$apt_dir/cache" -o "Dir::State::status=$apt_dir/status" -o APT::Get::List-Cleanup=0
        -o APT::Sandbox::User=root -o "APT::Architecture=$debian_arch" -o "APT::Architectures=$debian_arch")
    apt-get "${apt[@]}" update -q >/dev/null
    image=$(apt-cache "${apt[@]}" depends "linux-image-$debian_arch" | sed -n 's/.*Depends: \(linux-image-[^ ]*\)$/\1/p' | head -n1)
    headers=${image/linux-image/linux-headers}
    common=$(apt-cache "${apt[@]}" depends "$headers" | sed -n 's/.*Depends: \(linux-headers-[^ ]*-common[^ ]*\)$/\1/p' | head -n1)
    (cd "$dir/debs" && apt-get "${apt[@]}" download "$image" "$headers" "$common" >/dev/null)
    rm -rf "$dir/root" && mkdir -p "$dir/root"
    for deb in "$dir"/debs/*.deb; do dpkg-deb -x "$deb" "$dir/root"; done
    # trixie's packages put modules in usr/lib only (merged /usr): lib is its link there.
    [ -d "$dir/root/lib" ] || ln -s usr/lib "$dir/root/lib"
    version=$(ls "$dir/root/lib/modules")
    depmod -b "$dir/root" "$version"
    echo "$version" >"$dir/ready"
fi
version=$(cat "$dir/ready")

# The initramfs: busybox, the modules a 9p root and its overlay need (in the order modprobe
# resolves them, uncompressed), and /init.
if [ ! -f "$dir/initrd.v3.cpio.gz" ]; then
    staging=$(mktemp -d)
    mkdir -p "$staging"/{bin,proc,sys,dev,mnt,modules}
    cp "$guest_root/bin/busybox" "$staging/bin/busybox"  # the guest machine's own
    : >"$staging/modules/order"
    modprobe -d "$dir/root" -S "$version" -a --show-depends virtio_pci 9pnet_virtio 9p overlay |
        awk '$1 == "insmod" {print $2}' | while read -r module; do
            name=$(basename "$module")
            case "$name" in
            *.xz) xz -dc "$module" >"$staging/modules/${name%.xz}"; name=${name%.xz} ;;
            *.zst) zstd -qdc "$module" >"$staging/modules/${name%.zst}"; name=${name%.zst} ;;
            *) cp "$module" "$staging/modules/$name" ;;
            esac
            grep -qx "$name" "$staging/modules/order" || echo "$name" >>"$staging/modules/order"
        done
    cat >"$staging/init" <<'INIT'
#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc && mount -t sysfs sys /sys && mount -t devtmpfs dev /dev
for module in $(cat /modules/order); do insmod "/modules/$module" 2>/dev/null; done
run=$(sed -n 's/.*leaktrace_run=\([^ ]*\).*/\1/p' /proc/cmdline)
tree=$(sed -n 's/.*leaktrace_tree=\([^ ]*\).*/\1/p' /proc/cmdline)
mkdir -p /mnt/host /mnt/up /mnt/root
mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=262144 host /mnt/host
mount -t tmpfs -o size=75% tmpfs /mnt/up && mkdir -p /mnt/up/upper /mnt/up/work
mount -t overlay overlay -o lowerdir=/mnt/host,upperdir=/mnt/up/upper,workdir=/mnt/up/work /mnt/root
# A root that is not the host's (arm64's): the checkout comes on its own share, at its own path.
if [ -n "$tree" ]; then
    mkdir -p /mnt/tree /mnt/up/tree-upper /mnt/up/tree-work "/mnt/root$tree"
    mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=262144 tree /mnt/tree
    mount -t overlay overlay -o lowerdir=/mnt/tree,upperdir=/mnt/up/tree-upper,workdir=/mnt/up/tree-work "/mnt/root$tree"
fi
# A tmpfs /tmp, unless the checkout is under the host's /tmp (the overlay keeps it writable).
case "$run" in /tmp/*) ;; *) mount -t tmpfs tmpfs /mnt/root/tmp ;; esac
mkdir -p "/mnt/root$run"
mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 run "/mnt/root$run"
for fs in proc sys dev; do mount --move "/$fs" "/mnt/root/$fs"; done
chroot /mnt/root /bin/bash "$run/guest.sh"
sync
poweroff -f
INIT
    chmod +x "$staging/init"
    (cd "$staging" && find . | cpio -o -H newc --quiet | gzip -1) >"$dir/initrd.v3.cpio.gz.partial"
    mv "$dir/initrd.v3.cpio.gz.partial" "$dir/initrd.v3.cpio.gz"
    rm -rf "$staging"
fi

accel=tcg cpu=max
if [ "${LEAKTRACE_VM_ACCEL:-}" = kvm ]; then accel=kvm cpu=host; fi
# Under TCG every instruction is emulated: the tests' timeouts stretch (helpers.SLOWDOWN).
[ "$accel" = kvm ] || export LEAKTRACE_TEST_SLOWDOWN=${LEAKTRACE_TEST_SLOWDOWN:-4}

# The run: its command, environment and status in a directory of its own, shared read-write.
run=$(mktemp -d "$top/build/vm/run.XXXXXX")
trap 'rm -rf "$run"' EXIT
{
    echo "set -u"
    echo "mount -t tracefs nodev /sys/kernel/tracing; mount -t bpf bpf /sys/fs/bpf; mount -t debugfs nodev /sys/kernel/debug"
    # bcc compiles against /lib/modules/VERSION/build: the guest kernel's own headers.
    echo "mkdir -p /lib/modules/$version && mount --bind $dir/root/lib/modules/$version /lib/modules/$version"
    for headers in "$dir"/root/usr/src/*; do echo "ln -sfn $headers /usr/src/$(basename "$headers")"; done
    echo "ip link set lo up 2>/dev/null || busybox ip link set lo up"
    echo "export PATH=$(printf %q "$PATH") HOME=/root LANG=C.UTF-8${CI:+ CI=$CI}"
    env | grep -E '^LEAKTRACE_[A-Z_]*=' | sed 's/^/export /' || true
    echo "cd $(printf %q "$top")"
    # arm64: its own .venv over the x86-64 one (in the overlay), the checkout's package built in place.
    if [ "$arch" = arm64 ]; then
        echo "rm -rf .venv && python3 -m venv --system-site-packages .venv"
        echo ".venv/bin/pip install -q --no-build-isolation --no-deps -e . >/dev/null"
    fi
    printf '%q ' "$@"
    echo
    echo "echo \$? >$run/status"
} >"$run/guest.sh"

machine=(-accel "$accel" -cpu "$cpu" -vga none) console=ttyS0 tree=() tree_arg=
if [ "$arch" = arm64 ]; then
    # TCG only; pointer authentication by QEMU's own cipher (the architected one is slow to emulate).
    machine=(-M virt -accel tcg -cpu max,pauth-impdef=on) console=ttyAMA0
    tree=(-virtfs "local,path=$top,mount_tag=tree,security_model=passthrough,readonly=on,multidevs=remap")
    tree_arg=" leaktrace_tree=$top"
fi
timeout "${LEAKTRACE_VM_TIMEOUT:-5400}" "$qemu" "${machine[@]}" -m "$memory" -smp 2 \
    -display none -no-reboot -monitor none -serial stdio -nic none \
    -kernel "$(ls "$dir"/root/boot/vmlinuz-*)" -initrd "$dir/initrd.v3.cpio.gz" \
    -append "console=$console quiet loglevel=3 panic=-1 leaktrace_run=$run$tree_arg" \
    -virtfs "local,path=$guest_root,mount_tag=host,security_model=passthrough,readonly=on,multidevs=remap" "${tree[@]}" \
    -virtfs "local,path=$run,mount_tag=run,security_model=passthrough" </dev/null |
    sed -u -e 's/\r$//' -e 's/\x1bc//g' -e 's/\x1b\[[?0-9;]*[a-zA-Z]//g' |
    grep -a --line-buffered -v -e '\] reboot: Power down$' -e '^SeaBIOS (version' -e '^Booting from ROM' || true
if [ ! -s "$run/status" ]; then
    echo "vm.sh: the VM ($arch, $series, $version) ended without COMMAND's status" >&2
    exit 1
fi
exit "$(cat "$run/status")"
