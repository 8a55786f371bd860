#!/usr/bin/env bash
# Provisions a machine of one's own as a demo (CI runs it with DESTDIR set):
# sets leaktrace up, puts it on PATH, and installs a demo service that leaks.
#   DESTDIR   install under this directory instead of / and start nothing (for tests)
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
dest=${DESTDIR:-}

bash scripts/setup.sh
mkdir -p "$dest/usr/local/bin" "$dest/etc/systemd/system"
gcc -O0 -g -fno-omit-frame-pointer -pthread -o "$dest/usr/local/bin/leaky-demo" scripts/demo/leaky.c
ln -sfn "$repo/.venv/bin/leaktrace" "$dest/usr/local/bin/leaktrace"
cat > "$dest/etc/systemd/system/leaky-demo.service" <<UNIT
[Unit]
Description=leaktrace demo: a small service that leaks about 0.5 KB a second

[Service]
ExecStart=/usr/local/bin/leaky-demo 0
Restart=always

[Install]
WantedBy=multi-user.target
UNIT

if [ -z "$dest" ] && [ -d /run/systemd/system ]; then
    systemctl daemon-reload
    systemctl enable --now leaky-demo.service
    echo "provision_vm.sh: leaky-demo.service is running; try: sudo leaktrace --all 5"
fi
