"""Each gate's report section, one module per gate: `markdown(g)` (its lines of report.md) and, where the
page shows more than the gate's measurements, `html(g)` (its plots and tables in report.html). Each reads the
gate's stored result (report.json's `gates.<name>`) through the gate's type in `qval/results/`.

Every gate `qval.gate_registry` declares has its module here. A gate a stored report names that is not declared
shows its measurements and notes (`md_parts.generic_section`); so does a gate that did not finish (its details hold
only what it knew before it stopped).
"""

from __future__ import annotations

from typing import Any, Callable

from ...gate_registry import covered
from . import agreement, depth, export_fidelity, longgen, quality, retrieval, tasks

_MODULES = dict(covered("report section", {
    "agreement": agreement, "depth": depth, "retrieval": retrieval, "quality": quality, "longgen": longgen, "tasks": tasks,
    "export_fidelity": export_fidelity}, "qval/report/sections/__init__.py"))

#: each gate's report.md section
MARKDOWN: dict[str, Callable[[dict[str, Any]], list[str]]] = {name: m.markdown for name, m in _MODULES.items()}
#: each gate's report.html plots and tables, shown under its measurements
HTML: dict[str, Callable[[dict[str, Any]], str]] = {name: m.html for name, m in _MODULES.items() if hasattr(m, "html")}
