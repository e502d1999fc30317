"""The export check: report.md's counts and a note per fidelity check that did not pass (report.html shows
its measurements only); reads `ExportFidelityDetails`.
"""

from __future__ import annotations

from typing import Any

from ...report.md_parts import generic_section
from ...results import parse
from .result import ExportFidelityDetails


def markdown(g: dict[str, Any]) -> list[str]:
    """The export check: its two counts, and a note per fidelity check that did not pass."""
    d = parse(ExportFidelityDetails, g["details"], "report.json's gate export_fidelity")
    return generic_section({**g, "details": {"notes": d.notes}})
