"""Gates: each gate module defines a `GateSpec` (its runner, the thresholds its config section
sets, its inputs); `GATES` registers them in the run order `qval.gate_registry.DECLARED` declares.

The specs' parts (`GateContext`, `GateSpec`, `max_positions`, `context_problem`) live in
`qval.gates.base` and are re-exported here; gate modules import them from there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..export import gate as export_fidelity
from ..gate_registry import covered
from ..registry import Registry
from . import agreement, depth, longgen, quality, retrieval, tasks
from .base import GateContext, GateSpec, context_problem, max_positions  # noqa: F401

if TYPE_CHECKING:
    from ..config import GateConfig

GATES: Registry[GateSpec] = Registry("gate")

_SPECS = {m.SPEC.name: m.SPEC for m in (agreement, depth, quality, longgen, retrieval, tasks, export_fidelity)}
for _name, _spec in covered("gate module", _SPECS, "qval/gates/__init__.py"):
    GATES.register(_name)(_spec)
del _name, _spec


def data_identities(cfg: "GateConfig") -> dict[str, Any]:
    """Each enabled gate's data sets with their content hashes (its inputs' "data"), in run order:
    report.json's `data` after the calibration's (`qval.report.schema.build_report`)."""
    return {spec.name: spec.inputs(cfg).get("data") for spec in GATES.ordered() if spec.enabled(cfg)}
