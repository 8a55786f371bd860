"""The HTML page's flame graph library, fetched from the npm registry into the package:
d3 and d3-flame-graph at pinned versions, each tarball checked against its registry
integrity (sha512) before any file is taken from it, with their licences.

    python3 scripts/web_assets.py [DIR]     (default: src/leaktrace/outputs/web)

scripts/setup.sh runs it, and so does the package build (setup.py), so that a wheel built
from a clean checkout writes --html pages."""

from __future__ import annotations

import base64
import hashlib
import io
import sys
import tarfile
import urllib.request
from pathlib import Path

REGISTRY = "https://registry.npmjs.org"
# package, version, its tarball's sha512 as the registry gives it, {file in the tarball: name here}
PACKAGES = (
    (
        "d3",
        "7.9.2",
        "ZKb/mONPVKzaO5UlcWcwN8bS4ezvQaYu+bsou+XgNABdGC800kwH651ADTbbTxMPHW13UlvbQafdmJQDk1w7Mg==",
        {"package/dist/d3.min.js": "d3.min.js", "package/LICENSE": "d3.LICENSE"},
    ),
    (
        "d3-flame-graph",
        "5.0.0",
        "ALZQ4at8Dex8HCoj9D5p5TY6gLNEc2vAZAy+NKO/6GLEfhYJmGxYuRClO6RPoplndyOHxQTPipdlGeMggkjtnQ==",
        {
            "package/dist/d3-flamegraph.umd.min.js": "d3-flamegraph.umd.min.js",
            "package/dist/d3-flamegraph.css": "d3-flamegraph.css",
            "package/LICENSE": "d3-flame-graph.LICENSE",
        },
    ),
)
DEFAULT_DIRECTORY = Path(__file__).parents[1] / "src" / "leaktrace" / "outputs" / "web"


def wanted_files() -> list[str]:
    return [name for _, _, _, files in PACKAGES for name in files.values()]


def fetch(directory: Path) -> None:
    """Puts every file in directory, fetching only packages with a file missing."""
    directory.mkdir(parents=True, exist_ok=True)
    for package, version, integrity, files in PACKAGES:
        if all((directory / name).is_file() for name in files.values()):
            continue
        url = f"{REGISTRY}/{package}/-/{package}-{version}.tgz"
        try:
            with urllib.request.urlopen(url, timeout=60) as response:
                data = response.read()
        except OSError as e:  # URLError included: one line, not a traceback, from set-up
            raise SystemExit(f"web_assets.py: cannot fetch {url}: {getattr(e, 'reason', e)}") from None
        if base64.b64encode(hashlib.sha512(data).digest()).decode() != integrity:
            raise SystemExit(f"web_assets.py: {url} does not match its pinned sha512")
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
            for member, name in files.items():
                extracted = archive.extractfile(member)
                if extracted is None:
                    raise SystemExit(f"web_assets.py: {url} has no {member}")
                (directory / name).write_bytes(extracted.read())


if __name__ == "__main__":
    fetch(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_DIRECTORY)
