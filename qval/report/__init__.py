"""Reports: report.json (the record, versioned schema) and report.md (for people)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..io import atomic_write_json, atomic_write_text
from .markdown import render_markdown


def write_reports(run_dir: Path, report: dict[str, Any]) -> None:
    atomic_write_json(run_dir / "report.json", report)
    atomic_write_text(run_dir / "report.md", render_markdown(report))
