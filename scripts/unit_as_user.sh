#!/usr/bin/env bash
# The unit tests as a user who is not root, on a checkout that user owns (the committed tree,
# plus what set-up built: the native extensions and the HTML page's assets), with a copy of the
# venv beside it: what a contributor without root runs. Nothing is run from root's checkout,
# which that user may not reach (a clone in a directory of mode 0700, as mktemp -d makes).
set -euo pipefail
cd "$(dirname "$0")/.."
user=leaktrace-unit
id "$user" >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin "$user"
checkout=$(mktemp -d /tmp/leaktrace-unit.XXXXXX)
trap 'rm -rf "$checkout"' EXIT
git clone -q . "$checkout/tree"
(cd src && find . -name '*.so' -print0 && find leaktrace/outputs/web -type f -print0) |
    (cd src && xargs -0 cp --parents -t "$checkout/tree/src")
cp -a .venv "$checkout/venv"
chown -R "$user": "$checkout"
cd "$checkout/tree"
runuser -u "$user" -- env -u CI HOME="$checkout" PYTHONPATH="$checkout/tree/src" \
    "$checkout/venv/bin/python" -m pytest -q -p no:cacheprovider tests/unit
