"""Every gate, declared once: its name, its place in the run order, its report section's title and
the table of the figures it is judged on (`qval.gate_metrics`). Torch-free and at the config's layer,
so every layer reads it.

The lists of gates in the other layers are derived from `DECLARED`: the run order of `qval.gates.GATES`
and `qval.judges.JUDGES`, the gates `qval.results.TYPES` and `qval.report.sections` cover, report.md's and
report.html's titles. Each of those layers keeps only its own modules by name and refuses, when
imported, a declared gate it has no module for or a module of an undeclared gate (`covered`).

>>> [d.name for d in DECLARED.ordered()][:3], DECLARED.get("quality").html_title
(['agreement', 'depth', 'quality'], 'Gate 2 — perplexity and BLEU')
>>> covered("judge", {"agreement": 1}, "qval/judges/__init__.py")
Traceback (most recent call last):
...
ValueError: qval/judges/__init__.py has no judge for the declared gate(s) depth, quality, longgen, retrieval, tasks, export_fidelity (qval/gate_registry.py)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, TypeVar

from .gate_metrics import AGREEMENT, DEPTH, LONGGEN, QUALITY, RETRIEVAL, TASKS, GateMetrics
from .registry import Registry

T = TypeVar("T")


@dataclass(frozen=True)
class GateDecl:
    #: its config section (`gates.<name>`, where it has one), its stage folder (`gate_<name>`), its key in report.json
    name: str
    #: its section's heading in report.md (and report.html, unless `html_title`)
    title: str
    #: the figures it is judged on and the config fields that limit them (None: its limits are fixed)
    metrics: GateMetrics | None = None
    #: report.html's heading where it differs from report.md's
    html_title: str | None = None


#: in run order (a gate runs after those whose results it reads)
DECLARED: Registry[GateDecl] = Registry("gate")

for _decl in (
    GateDecl("agreement", "Gate 1 — logits agreement", AGREEMENT),
    GateDecl("depth", "Gate 1 at depth — long context", DEPTH),  # gate 1 at depth: long documents, per depth bucket
    #: report.html has always headed gate 2 without "/chrF"; kept so that the page stays byte-identical
    GateDecl("quality", "Gate 2 — perplexity and BLEU/chrF", QUALITY, html_title="Gate 2 — perplexity and BLEU"),
    GateDecl("longgen", "Gate 3 — long-generation stability", LONGGEN),
    GateDecl("retrieval", "Retrieval matrix — context length × needle depth", RETRIEVAL),
    GateDecl("tasks", "Gate 4 — answers, item by item", TASKS),
    GateDecl("export_fidelity", "export_fidelity"),  # the export backends' fidelity check (enabled for those only)
):
    DECLARED.register(_decl.name)(_decl)
del _decl


def names() -> list[str]:
    """The declared gates' names, in run order."""
    return [d.name for d in DECLARED.ordered()]


def covered(what: str, by_gate: Mapping[str, T], where: str) -> list[tuple[str, T]]:
    """`by_gate`'s entries in run order, or a ValueError when it misses a declared gate or holds another."""
    missing = [n for n in names() if n not in by_gate]
    if missing:
        raise ValueError(f"{where} has no {what} for the declared gate(s) {', '.join(missing)} (qval/gate_registry.py)")
    extra = sorted(set(by_gate) - set(names()))
    if extra:
        raise ValueError(f"{where} has a {what} for {', '.join(extra)}, which qval/gate_registry.py does not declare")
    return [(n, by_gate[n]) for n in names()]
