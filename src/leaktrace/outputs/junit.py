"""The leak gate as JUnit XML (--junit FILE): a test case a judged process, failed when leaks
of the error kinds remain after the suppressions, in error when a command exited unjudged;
what CI servers (Jenkins, GitLab, GitHub's test reporters) show a suite's results from. The
leak check's text (loss records, LEAK SUMMARY) is the case's system-out."""

from __future__ import annotations

from dataclasses import dataclass

from leaktrace.outputs.valgrind_xml import xml_attribute, xml_text

SUITE = "leaktrace leak check"


@dataclass(frozen=True)
class GateCase:
    """One process the gate judged (or could not)."""

    name: str  # its command line and pid
    seconds: float  # how long it stood still for its judgement
    failure: str | None = None  # the leaks of the error kinds left, in one line
    error: str | None = None  # why it was not judged
    output: str = ""  # the leak check as text


def render_junit(cases: list[GateCase]) -> bytes:
    failures = sum(case.failure is not None for case in cases)
    errors = sum(case.error is not None for case in cases)
    seconds = sum(case.seconds for case in cases)
    head = f'tests="{len(cases)}" failures="{failures}" errors="{errors}"'
    lines = [
        '<?xml version="1.0" encoding="UTF-8"?>',
        f'<testsuites name={xml_attribute(SUITE)} {head} time="{seconds:.6f}">',
        f'  <testsuite name={xml_attribute(SUITE)} {head} skipped="0" time="{seconds:.6f}">',
    ]
    for case in cases:
        lines.append(
            f'    <testcase classname={xml_attribute(SUITE)} name={xml_attribute(case.name)} time="{case.seconds:.6f}">'
        )
        if case.failure is not None:
            lines.append(f'      <failure type="leak" message={xml_attribute(case.failure)}/>')
        if case.error is not None:
            lines.append(f'      <error type="unjudged" message={xml_attribute(case.error)}/>')
        if case.output:
            lines.append(f"      <system-out>{xml_text(case.output)}</system-out>")
        lines.append("    </testcase>")
    lines += ["  </testsuite>", "</testsuites>", ""]
    return "\n".join(lines).encode()
