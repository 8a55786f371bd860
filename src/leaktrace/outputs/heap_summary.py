"""The heap summary of `leaktrace heap`: what one walk of a glibc heap found, per arena,
by size, and what lies free (text and JSON)."""

from __future__ import annotations

import json

import numpy as np

from leaktrace.model.heap import HeapReport

LARGEST_CLASSES = 10


def _histogram(usable: np.ndarray) -> list[tuple[int, int, int]]:
    """(upper bound, blocks, bytes) per power-of-two class of usable sizes: 32, 64, ..."""
    if not len(usable):
        return []
    bounds = np.maximum(32, 2 ** np.ceil(np.log2(np.maximum(usable, 1).astype(np.float64)))).astype(np.uint64)
    return [
        (int(bound), int((bounds == bound).sum()), int(usable[bounds == bound].sum())) for bound in np.unique(bounds)
    ]


def _size_classes(usable: np.ndarray) -> list[tuple[int, int, int]]:
    """(usable size, blocks, bytes) of the sizes holding the most bytes, most first."""
    sizes, counts = np.unique(usable, return_counts=True)
    rows = sorted(zip(sizes.tolist(), counts.tolist()), key=lambda row: (-row[0] * row[1], row[0]))
    return [(size, count, size * count) for size, count in rows[:LARGEST_CLASSES]]


def heap_to_dict(report: HeapReport) -> dict:
    walk = report.walk
    free = sum(a.free_bytes for a in walk.arenas)
    used = int(walk.usable.sum())
    return {
        "pid": report.process.pid,
        "comm": report.process.comm,
        "glibc": walk.glibc,
        "method": walk.method,
        "complete": walk.complete,
        "problems": list(walk.problems),
        "pause_seconds": report.pause_seconds,
        "walk_seconds": walk.walk_seconds,
        "blocks": len(walk.addresses),
        "bytes": used,
        "sizes_are": "usable",
        "free_bytes": free,
        "free_chunks": sum(a.free_chunks for a in walk.arenas),
        "top_bytes": sum(a.top_bytes for a in walk.arenas),
        "libc_blocks": walk.libc_blocks,
        "arenas": [
            {
                "address": a.address,
                "main": a.main,
                "heaps": a.heaps,
                "blocks": a.blocks,
                "bytes": a.block_bytes,
                "free_chunks": a.free_chunks,
                "free_bytes": a.free_bytes,
                "top_bytes": a.top_bytes,
            }
            for a in walk.arenas
        ],
        "mmapped": {"blocks": int(walk.mmapped.sum()), "bytes": int(walk.usable[walk.mmapped].sum())},
        "histogram": [
            {"up_to": bound, "blocks": count, "bytes": total} for bound, count, total in _histogram(walk.usable)
        ],
        "size_classes": [
            {"size": size, "blocks": count, "bytes": total} for size, count, total in _size_classes(walk.usable)
        ],
    }


def _table(headers: list[str], rows: list[list]) -> list[str]:
    cells = [headers] + [[str(cell) for cell in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return ["  " + "  ".join(cell.rjust(width) for cell, width in zip(row, widths)).rstrip() for row in cells]


def render_heap_text(report: HeapReport) -> str:
    summary = heap_to_dict(report)
    walk = report.walk
    lines = [
        f"heap of pid {summary['pid']} ({summary['comm']}), glibc {walk.glibc}: {summary['bytes']} bytes in "
        f"{summary['blocks']} blocks in use (usable sizes); the process stood still "
        f"{report.pause_seconds * 1000:.1f} ms, the walk took {walk.walk_seconds * 1000:.1f} ms",
        f"  {walk.method}",
    ]
    arena_rows = [
        [
            f"{a['address']:#x}" + (" main" if a["main"] else ""),
            a["heaps"],
            a["blocks"],
            a["bytes"],
            a["free_chunks"],
            a["free_bytes"],
            a["top_bytes"],
        ]
        for a in summary["arenas"]
    ]
    arena_rows.append(["mmapped", "", summary["mmapped"]["blocks"], summary["mmapped"]["bytes"], "", "", ""])
    lines += _table(["arena", "heaps", "blocks", "bytes", "free chunks", "free bytes", "top bytes"], arena_rows)
    held = summary["bytes"] - summary["mmapped"]["bytes"]
    if held + summary["free_bytes"]:
        lines.append(
            f"  free in the arenas: {summary['free_bytes']} bytes in {summary['free_chunks']} chunks "
            f"({100 * summary['free_bytes'] / (held + summary['free_bytes']):.1f}% of their chunks' bytes; "
            f"top chunks not counted)"
        )
    if walk.libc_blocks:
        lines.append(f"  libc's own blocks left out (its threads' tcaches): {walk.libc_blocks}")
    lines += ["", "  by usable size:"]
    lines += _table(
        ["up to", "blocks", "bytes"], [[row["up_to"], row["blocks"], row["bytes"]] for row in summary["histogram"]]
    )
    lines += ["", f"  the {len(summary['size_classes'])} sizes holding the most bytes:"]
    lines += _table(
        ["size", "blocks", "bytes"], [[row["size"], row["blocks"], row["bytes"]] for row in summary["size_classes"]]
    )
    lines += [f"  heap walk incomplete: {problem}" for problem in dict.fromkeys(walk.problems)]
    return "\n".join(lines) + "\n"


def render_heap_json(report: HeapReport, unreachable: dict | None) -> str:
    return json.dumps({**heap_to_dict(report), "unreachable": unreachable}, separators=(",", ":")) + "\n"
