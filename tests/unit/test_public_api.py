"""The package's lazy exports: each resolves, and the TYPE_CHECKING block that types them
for mypy and editors names the same objects from the same modules."""

from __future__ import annotations

import ast
import importlib
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


def test_every_export_resolves_to_the_object_its_module_defines():
    for name, module in leaktrace._EXPORTS.items():
        defined = importlib.import_module(f"leaktrace.{module}")
        assert getattr(leaktrace, name) is getattr(defined, name), (name, module)
        assert callable(getattr(defined, name)), name  # every export is a class or a function
