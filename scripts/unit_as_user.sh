#!/usr/bin/env bash
# The unit tests as a user who is not root, on a checkout that user owns (the committed tree,
# plus what set-up built: the native extensions and the HTML page's assets), with the venv's
# python: what a contributor without root runs.
set -euo pipefail
cd "$(dirname "$0")/.."
user=leaktrace-unit
id "$user" >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin "$user"
checkout=$(mktemp -d /tmp/leaktrace-unit.XXXXXX)
trap 'rm -rf "$checkout"' EXIT
git clone -q . "$checkout/tree"
(cd src && find . -name '*.so' -print0 && find leaktrace/outputs/web -type f -print0) |
    (cd src && xargs -0 cp --parents -t "$checkout/tree/src")
chown -R "$user": "$checkout"
cd "$checkout/tree"
runuser -u "$user" -- env -u CI HOME="$checkout" PYTHONPATH="$checkout/tree/src" \
    "$OLDPWD/.venv/bin/python" -m pytest -q -p no:cacheprovider tests/unit
