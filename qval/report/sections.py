"""Each gate's report section: its package's `section.py` (`qval/gates/<name>/section.py`), with `markdown(g)` (its
lines of report.md) and, where the page shows more than the gate's measurements, `html(g)` (its plots and tables in
report.html). Each reads the gate's stored result (report.json's `gates.<name>`) through the gate's type (its
package's `result.py`).

`MARKDOWN` and `HTML` hold every gate `qval.gate_registry` declares, read on first use (a section imports the
report's helpers, so this module loads none of them when it is imported). A gate a stored report names that is not
declared shows its measurements and notes (`md_parts.generic_section`); so does a gate that did not finish (its
details hold only what it knew before it stopped).
"""

from __future__ import annotations

from functools import cache
from types import ModuleType
from typing import Any


@cache
def _modules() -> dict[str, ModuleType]:
    from ..gate_registry import parts

    return {d.name: m for d, m in parts("section")}


def __getattr__(name: str) -> Any:
    if name == "MARKDOWN":  # each gate's report.md section
        return {gate: m.markdown for gate, m in _modules().items()}
    if name == "HTML":  # each gate's report.html plots and tables, shown under its measurements
        return {gate: m.html for gate, m in _modules().items() if hasattr(m, "html")}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
