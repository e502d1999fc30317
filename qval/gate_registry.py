"""Every gate, registered once: `DECLARED` holds each gate package's declaration (`GATE`, a `GateDecl` in
`qval/gates/<name>/__init__.py`) in run order (a gate runs after those whose results it reads). Torch-free and
at the config's layer, so every layer reads it.

Every list of gates is derived from it: the run order of `qval.gates.GATES` and `qval.judges.JUDGES`, the
types of `qval.results.TYPES`, the sections of `qval.report.sections`, report.md's and report.html's titles
(from each gate's part of that layer, `parts`); `GatesConfig`'s sections (`qval.config_gates`), `TABLES` and
`SWEEP_FIGURES` in the config sections' order (`sections`).

>>> names()[:3], DECLARED.get("quality").html_title
(['agreement', 'depth', 'quality'], 'Gate 2 — perplexity and BLEU')
>>> [d.name for d in sections()][:4]
['agreement', 'quality', 'longgen', 'depth']
"""

from __future__ import annotations

from importlib import import_module
from types import ModuleType

from .gate_decl import GateDecl
from .gate_metrics import GateMetrics
from .registry import Registry

#: the gate packages, `qval/gates/<name>/`, in run order (a gate runs after those whose results it reads):
#: registering a gate is its name here
PACKAGES: tuple[str, ...] = ("agreement", "depth", "quality", "longgen", "retrieval", "tasks", "export_fidelity")

#: in run order
DECLARED: Registry[GateDecl] = Registry("gate")


def _declaration(package: str) -> GateDecl:
    decl = import_module(f"qval.gates.{package}").GATE
    if decl.name != package:
        raise TypeError(f"qval/gates/{package}/__init__.py declares the gate {decl.name!r}: a gate's package is named after it")
    return decl


for _package in PACKAGES:
    DECLARED.register(_package)(_declaration(_package))
del _package


def names() -> list[str]:
    """The declared gates' names, in run order."""
    return [d.name for d in DECLARED.ordered()]


def sections() -> list[GateDecl]:
    """The gates with a config section, in the sections' order (`section_order`)."""
    return sorted((d for d in DECLARED.ordered() if d.config is not None), key=lambda d: d.section_order or 0)


def parts(what: str) -> list[tuple[GateDecl, ModuleType]]:
    """Each declared gate with its part `what` (`qval.gate_decl.PARTS`), imported, in run order. A layer asks
    for its own part only: the results their `result`, the judges their `judge`, the report its `section`."""
    return [(d, import_module(d.part(what))) for d in DECLARED.ordered()]


#: each table of figures, in the config sections' order
TABLES: tuple[GateMetrics, ...] = tuple(d.metrics for d in sections() if d.metrics is not None)

#: (gate, measurement, column header) of every sweep column, in table order
SWEEP_FIGURES: tuple[tuple[str, str, str], ...] = tuple((t.gate, m.key, m.sweep) for t in TABLES for m in t.metrics if m.sweep)
