"""The README stays a user's page, and the docs name only files that exist."""

from __future__ import annotations

import ast
import json
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SOURCE_NAME = re.compile(r"`([\w./-]+\.(?:py|c|h|sh|cpp))`")
OTHER_PROJECTS = {"native_heapdump_viewer.py"}  # AOSP's development/scripts


def tracked_files() -> list[str]:
    return subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()


def test_the_readme_is_at_most_15000_bytes():
    assert len((ROOT / "README.md").read_bytes()) <= 15_000


def test_every_link_between_pages_leads_to_a_file():
    for page in PAGES:
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", page.read_text()):
            assert (page.parent / target).exists(), f"{page.name} links to {target}"


def test_every_source_file_the_docs_name_exists():
    files = tracked_files()
    missing = []
    for page in PAGES:
        for name in SOURCE_NAME.findall(page.read_text()):
            if name.startswith(("/", "./", "../")) or name in OTHER_PROJECTS:
                continue  # a path on the system, or in another project's sources
            if not any(path == name or path.endswith("/" + name) for path in files):
                missing.append(f"{page.name}: {name}")
    assert not missing, missing


def test_the_json_schema_names_every_counter_and_holds_a_rendered_report():
    import jsonschema

    from leaktrace.abi.layout import COUNTER_FIELDS
    from leaktrace.analysis.symbolize import SymbolizedSnapshot
    from leaktrace.model.snapshot import AllocationGroup, Counters, ProcessInfo, Snapshot
    from leaktrace.outputs.json_report import render_json

    schema = json.loads((ROOT / "docs" / "report.schema.json").read_text())
    assert schema["properties"]["counters"]["required"] == list(COUNTER_FIELDS)
    snapshot = Snapshot(
        1.0,
        (AllocationGroup(7, 24, 2, ()),),
        Counters(allocations=2),
        processes={7: ProcessInfo(7, "prog", "prog", "")},
    )
    report = json.loads(render_json(SymbolizedSnapshot(snapshot, {})))
    jsonschema.Draft202012Validator(schema).validate(report)
    report["counters"]["made_up"] = 1
    assert not jsonschema.Draft202012Validator(schema).is_valid(report)


def project_classes() -> dict[str, tuple[set[str], list[str]]]:
    """Every class under src/leaktrace: its members (methods, class attributes, attributes its
    methods set on self) and the names of its bases."""
    classes: dict[str, tuple[set[str], list[str]]] = {}
    for path in (ROOT / "src" / "leaktrace").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ClassDef):
                continue
            members, bases = classes.setdefault(node.name, (set(), []))
            bases += [base.id if isinstance(base, ast.Name) else getattr(base, "attr", "") for base in node.bases]
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                    members.add(item.name)
                    members.update(
                        target.attr
                        for target in ast.walk(item)
                        if isinstance(target, ast.Attribute)
                        and isinstance(target.ctx, ast.Store)
                        and isinstance(target.value, ast.Name)
                        and target.value.id == "self"
                    )
                elif isinstance(item, ast.Assign):
                    members.update(target.id for target in item.targets if isinstance(target, ast.Name))
                elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    members.add(item.target.id)
    return classes


# `Class.member`, `module.Class.member`, or Class.member( anywhere (the diagrams' calls).
NAMED_MEMBER = re.compile(r"`(?:[a-z_]\w*\.)*([A-Z]\w*)\.(\w+)(?:\(\))?`|\b([A-Z]\w*[a-z]\w*)\.([a-z_]\w*)\(")


def test_every_member_of_a_class_of_ours_the_docs_name_exists():
    classes = project_classes()

    def has(name: str, member: str, seen: tuple[str, ...] = ()) -> bool:
        members, bases = classes[name]
        return member in members or any(
            has(base, member, (*seen, name)) for base in bases if base in classes and base not in seen
        )

    missing = []
    for page in PAGES:
        for found in NAMED_MEMBER.findall(page.read_text()):
            name, member = found[:2] if found[0] else found[2:]
            if name in classes and not has(name, member):  # other projects' classes are theirs to name
                missing.append(f"{page.name}: {name}.{member}")
    assert not missing, missing


NAMED_IDENTIFIER = re.compile(r"`([a-z_][a-z0-9_]*_[a-z0-9_]+)(?:\(\))?`")  # a function, field or counter
# Names the docs give from other projects: the kernel's BPF helpers, C++'s library,
# prometheus-client's process metrics.
OTHER_PROJECT_NAMES = {"bpf_for_each_map_elem", "bpf_get_stack", "make_unique", "process_cpu_seconds_total"}


def test_every_function_field_or_counter_the_docs_name_is_in_the_code():
    """A snake_case name in backticks (a Python or C function, a field, a counter) is in some
    tracked source file, as a word or the end of one (`stacks_truncated_<reason>`); a
    Prometheus counter's name may end in the _total its client adds."""
    words = set()
    for path in tracked_files():
        if path.endswith((".py", ".c", ".h", ".sh", ".toml", ".supp", ".json")) and not path.startswith("docs/"):
            words.update(word.lower() for word in re.findall(r"\w+", (ROOT / path).read_text(errors="replace")))
    text = " ".join(sorted(words))
    missing = [
        f"{page.name}: {name}"
        for page in PAGES
        for name in sorted(set(NAMED_IDENTIFIER.findall(page.read_text())) - OTHER_PROJECT_NAMES)
        if name.removesuffix("_total") not in words and f"_{name}" not in text
    ]
    assert not missing, missing


def test_the_architecture_names_every_source_file():
    """A module, C file or header added to the package is placed in docs/architecture.md."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    sources = [
        path
        for path in tracked_files()
        if path.startswith("src/leaktrace/") and path.endswith((".py", ".c", ".h")) and "/web/" not in path
    ]
    assert sources
    unnamed = [path for path in sources if Path(path).name not in text]
    assert not unnamed, unnamed
