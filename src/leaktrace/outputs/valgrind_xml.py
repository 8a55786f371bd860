"""A leak check as valgrind's XML (protocol 4, memcheck's): what CI dashboards read (Jenkins'
valgrind plugin, ValgrindCI, valgrind-codequality). One document a process: its preamble,
pid (no ppid: a snapshot does not keep it), the tool's and the program's argv, and an
<error> per loss record listed (the kinds --show-leak-kinds shows, suppressions applied),
smallest first with valgrind's
"N bytes in M blocks are KIND in loss record I of J" and its stack (ip, obj, fn, dir, file,
line); then the suppressions used, with the blocks each matched as its count.

Unlike valgrind, <leakedbytes> of a definitely lost record counts its own blocks only, not
those it reaches (valgrind's "(D direct, I indirect)"): those are indirectly lost records of
their own here as there.
"""

from __future__ import annotations

import os
import re

from leaktrace.analysis.suppressions import LeakCheckSettings
from leaktrace.analysis.symbolize import Frame, SymbolizedSnapshot
from leaktrace.model.snapshot import LeakCheck, LeakKind
from leaktrace.outputs.leak_check import listed_records, loss_record_title

ERROR_KINDS = {
    LeakKind.DEFINITE: "Leak_DefinitelyLost",
    LeakKind.INDIRECT: "Leak_IndirectlyLost",
    LeakKind.POSSIBLE: "Leak_PossiblyLost",
    LeakKind.REACHABLE: "Leak_StillReachable",
}


# What XML 1.0 cannot carry (a target's file names may hold any byte but / and NUL).
_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


# xml.sax.saxutils would do these, but it imports urllib (20 ms of every start-up).
_TEXT_ESCAPES = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;"})
_ATTRIBUTE_ESCAPES = str.maketrans(
    {"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "\n": "&#10;", "\r": "&#13;", "\t": "&#9;"}
)


def xml_text(text: str) -> str:
    """text as XML character data: escaped, and what XML cannot carry replaced by U+FFFD."""
    return _NOT_XML.sub("\ufffd", text).translate(_TEXT_ESCAPES)


def xml_attribute(text: str) -> str:
    """text as a quoted XML attribute value, likewise."""
    return '"' + _NOT_XML.sub("\ufffd", text).translate(_ATTRIBUTE_ESCAPES) + '"'


def _element(name: str, text: str | int, indent: str) -> str:
    return f"{indent}<{name}>{xml_text(str(text))}</{name}>"


def _frame(frame: Frame) -> list[str]:
    lines = ["      <frame>", _element("ip", f"0x{frame.address:X}", "        ")]
    if frame.module:
        lines.append(_element("obj", frame.module, "        "))
    if frame.function:
        lines.append(_element("fn", frame.function, "        "))
    if frame.file and frame.line:
        directory, name = os.path.split(frame.file)
        lines += [
            _element("dir", directory or ".", "        "),
            _element("file", name, "        "),
            _element("line", frame.line, "        "),
        ]
    return lines + ["      </frame>"]


def _argv(words: list[str], indent: str) -> list[str]:
    if not words:
        return []
    return [_element("exe", words[0], indent)] + [_element("arg", word, indent) for word in words[1:]]


def render_valgrind_xml(
    symbolized: SymbolizedSnapshot, check: LeakCheck, settings: LeakCheckSettings, tool_argv: list[str]
) -> bytes:
    """The leak check of one process as a valgrind XML document (protocol 4)."""
    process = symbolized.snapshot.processes.get(check.pid)
    # Its arguments joined by spaces, as read from /proc: split on them, never parsed as a shell's.
    command = check.command.split(" ") if check.command else [process.name if process else ""]
    lines = [
        '<?xml version="1.0"?>',
        "",
        "<valgrindoutput>",
        "",
        "<protocolversion>4</protocolversion>",
        "<protocoltool>memcheck</protocoltool>",
        "",
        "<preamble>",
        "  <line>leaktrace's leak check, in Memcheck's XML (valgrind's leak kinds)</line>",
        _element("line", f"Command: {check.command}", "  "),
        "</preamble>",
        "",
        _element("pid", check.pid, ""),
        "<tool>memcheck</tool>",
        "",
        "<args>",
        "  <vargv>",
        *_argv(tool_argv, "    "),
        "  </vargv>",
        "  <argv>",
        *_argv(command, "    "),
        "  </argv>",
        "</args>",
        "",
        "<status>",
        "  <state>FINISHED</state>",
        "</status>",
        "",
    ]
    listed = listed_records(check, settings)
    for number, record in enumerate(() if settings.summary_only else listed, 1):
        lines += [
            "<error>",
            _element("unique", f"0x{number - 1:x}", "  "),
            "  <tid>1</tid>",
            _element("kind", ERROR_KINDS[record.kind], "  "),
            "  <xwhat>",
            _element("text", loss_record_title(record, number, len(listed)), "    "),
            _element("leakedbytes", record.bytes, "    "),
            _element("leakedblocks", record.blocks, "    "),
            "  </xwhat>",
            "  <stack>",
        ]
        for frame in symbolized.stack_of(record):
            lines += _frame(frame)
        lines += ["  </stack>", "</error>", ""]
    lines += ["<errorcounts>", "</errorcounts>", "", "<suppcounts>"]
    for used in check.suppressions_used:
        lines += ["  <pair>", _element("count", used.blocks, "    "), _element("name", used.name, "    "), "  </pair>"]
    lines += ["</suppcounts>", "", "</valgrindoutput>", ""]
    return "\n".join(lines).encode()
