"""The gates, one package each (`qval/gates/<name>/`): its `__init__` declares it (`GateDecl`: its config section,
its table of figures, its titles) and its modules are its parts, one per layer (`config`, `metrics`, `result`,
`judge`, `section`, `run`). `qval.gate_registry` registers them in run order.

`GATES` registers each gate's `GateSpec` (its run module's `SPEC`: its runner, the thresholds its config
section sets, its inputs) in that order. It is read on first use: importing this package, as every import of a
gate's declaration or of one of its torch-free parts does, loads no run module and no torch. The specs' parts
(`GateContext`, `GateSpec`, `max_positions`, `context_problem`) are in `qval.gates.base`.
"""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING, Any

from ..registry import read_on_first_use

if TYPE_CHECKING:
    from ..config import GateConfig
    from ..registry import Registry
    from .base import GateSpec


@cache
def _gates() -> "Registry[GateSpec]":
    from ..gate_registry import parts
    from ..registry import Registry

    gates: Registry[GateSpec] = Registry("gate")
    for d, run in parts("run"):
        if run.SPEC.name != d.name:
            raise ValueError(f"{d.part('run')}'s SPEC is named {run.SPEC.name!r}, not {d.name!r} as its gate declares")
        gates.register(d.name)(run.SPEC)
    return gates


__getattr__ = read_on_first_use(__name__, GATES=_gates)


def data_identities(cfg: "GateConfig") -> dict[str, Any]:
    """Each enabled gate's data sets with their content hashes (its inputs' "data"), in run order:
    report.json's `data` after the calibration's (`qval.report.schema.build_report`)."""
    return {spec.name: spec.inputs(cfg).get("data") for spec in _gates().ordered() if spec.enabled(cfg)}
