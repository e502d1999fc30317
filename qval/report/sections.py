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
from typing import Any, Callable

from ..registry import read_on_first_use


@cache
def _tables() -> dict[str, dict[str, Callable[[dict[str, Any]], Any]]]:
    from ..gate_registry import parts

    modules = parts("section")
    return {"MARKDOWN": {d.name: m.markdown for d, m in modules},  # each gate's report.md section
            "HTML": {d.name: m.html for d, m in modules if hasattr(m, "html")}}  # its report.html plots and tables


__getattr__ = read_on_first_use(__name__, MARKDOWN=lambda: _tables()["MARKDOWN"], HTML=lambda: _tables()["HTML"])
