"""Gates: each gate module defines a `GateSpec` (its runner, the thresholds its config section
sets, its inputs); `GATES` lists them explicitly, and the registry order is the run order.

The specs' parts (`GateContext`, `GateSpec`, `max_positions`, `context_problem`) live in
`qval.gates.base` and are re-exported here; gate modules import them from there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..export import gate as export_fidelity
from ..registry import Registry
from . import agreement, depth, longgen, quality, retrieval, tasks
from .base import GateContext, GateSpec, context_problem, max_positions  # noqa: F401

if TYPE_CHECKING:
    from ..config import GateConfig

GATES: Registry[GateSpec] = Registry("gate")

for _spec in (
    agreement.SPEC,
    depth.SPEC,  # gate 1 at depth: long documents, per depth bucket
    quality.SPEC,  # gate 2: needs agreement's positions, so after it
    longgen.SPEC,
    retrieval.SPEC,  # the retrieval matrix: context length × needle depth
    tasks.SPEC,  # gate 4: answers, item by item
    export_fidelity.SPEC,  # the export backends' fidelity check (enabled for those backends only)
):
    GATES.register(_spec.name)(_spec)
del _spec


def data_identities(cfg: "GateConfig") -> dict[str, Any]:
    """Each enabled gate's data sets with their content hashes (its inputs' "data"), in run order:
    report.json's `data` after the calibration's (`qval.report.schema.build_report`)."""
    return {spec.name: spec.inputs(cfg).get("data") for spec in GATES.ordered() if spec.enabled(cfg)}
