"""report.md's markup, shared by its sections (each gate's `section.py`): a table, a cell of text, and the
section of a gate that has none of its own."""

from __future__ import annotations

from typing import Any

from .formatting import estimate, interval


def table(headers: tuple[str, ...] | list[str], rows: list[list[Any]]) -> list[str]:
    """A Markdown table; each cell is printed as it is (the caller formats its numbers)."""
    return (["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
            + ["| " + " | ".join(str(x) for x in row) + " |" for row in rows])


def cell_text(x: Any, chars: int = 60) -> str:
    """An answer or excerpt for a table cell: one line, pipes escaped, cut to `chars`."""
    t = " ".join(str(x if x is not None else "–").split()).replace("|", "\\|")
    return t if len(t) <= chars else t[: chars - 1] + "…"


def generic_section(g: dict[str, Any]) -> list[str]:
    """A gate without a section of its own, or a typed gate that did not finish: its measurements, and
    the notes its details carry."""
    lines = ["| figure | value | 95% interval |", "|---|---|---|"]
    for k, e in g["measurements"].items():
        lines.append(f"| {k} | {estimate(e)} | {interval(e)} |")
    for note in g["details"].get("notes", []):
        lines.append(f"\nNote: {note}")
    return lines
