"""What a gate declares, once, in its package's `__init__.py` (`qval/gates/<name>/`): its name, its report
titles, its config section and the table of the figures it is judged on, and where its other parts are.

A gate's parts are modules of its package, one per layer: `result` (its details type, `DETAILS`), `judge`
(`enabled`, `thresholds`), `section` (`markdown`, optionally `html`) and `run` (`SPEC`, the models). The
declaration names them by module path only, so reading it loads no part: each layer imports the parts it
needs (`qval.gate_registry.parts`). Torch-free and pydantic-free, at the config's layer.

>>> d = GateDecl("x", "Gate X", "qval.gates.x")
>>> d.part("judge"), GateDecl("y", "Y", "qval.gates.y", run="qval.y_gate").part("run")
('qval.gates.x.judge', 'qval.y_gate')
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .gate_metrics import GateMetrics

#: the parts of a gate, each a module of its package (or `GateDecl.run` for the run)
PARTS = ("result", "judge", "section", "run")


@dataclass(frozen=True)
class GateDecl:
    #: its config section (`gates.<name>`, where it has one), its stage folder (`gate_<name>`), its key in report.json
    name: str
    #: its section's heading in report.md (and report.html, unless `html_title`)
    title: str
    #: its package, `qval.gates.<name>` (its `__name__`): its parts are the package's modules
    package: str
    #: the figures it is judged on and the config fields that limit them (None: its limits are fixed)
    metrics: GateMetrics | None = None
    #: its config section's model (`gates.<name>`); None: it has no section
    config: Any = None
    #: its place among the config's gate sections (the order of `gates:` in docs/config.md, of the tables and of
    #: sweep.md's columns); None where it has no section
    section_order: int | None = None
    #: whether its section is on when a config leaves it out
    enabled_by_default: bool = False
    #: report.html's heading where it differs from report.md's
    html_title: str | None = None
    #: its run module where it is not its package's `run`
    run: str | None = None

    def part(self, what: str) -> str:
        """The module path of one of its parts (`PARTS`)."""
        if what not in PARTS:
            raise ValueError(f"a gate has no part {what!r}; its parts are {', '.join(PARTS)}")
        return self.run if what == "run" and self.run else f"{self.package}.{what}"
