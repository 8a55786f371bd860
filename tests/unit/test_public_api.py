"""The package's lazy exports: each resolves, and the TYPE_CHECKING block that types them
for mypy and editors names the same objects from the same modules."""

from __future__ import annotations

import ast
from pathlib import Path

import leaktrace

INIT = Path(leaktrace.__file__)


def typed_exports() -> dict[str, str]:
    """name -> module, from the `if TYPE_CHECKING:` block of __init__.py."""
    tree = ast.parse(INIT.read_text())
    [block] = [node for node in tree.body if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"]
    return {
        alias.name: node.module.removeprefix("leaktrace.")
        for node in block.body
        if isinstance(node, ast.ImportFrom) and node.module
        for alias in node.names
    }


def test_the_typed_block_names_every_lazy_export():
    assert typed_exports() == leaktrace._EXPORTS


def test_every_export_resolves():
    for name in leaktrace._EXPORTS:
        assert getattr(leaktrace, name) is not None
