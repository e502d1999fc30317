"""Reports: report.json (the record, versioned schema: schema.py), report.md and report.html (for
people), and layers.csv (the per-quantizer scale diagnostics, when the run has them)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..io import atomic_write_json, atomic_write_text
from .diagnostics_csv import layers_csv
from .markdown import render_markdown


def write_reports(run_dir: Path, report: dict[str, Any]) -> None:
    from .html import render_html

    diagnostics = report.get("diagnostics")
    if diagnostics and diagnostics.get("layers") is not None:
        atomic_write_text(run_dir / "layers.csv", layers_csv(diagnostics["layers"]))
        diagnostics["layers_csv"] = "layers.csv"
    atomic_write_json(run_dir / "report.json", report)
    atomic_write_text(run_dir / "report.md", render_markdown(report))
    atomic_write_text(run_dir / "report.html", render_html(report))
