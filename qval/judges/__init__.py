"""Judging without torch: each gate's judge turns what the gate measured into figures (its summaries)
and the config's limits into `Threshold`s; `verdict` decides a whole run from stored results.

A gate module (`qval.gates.*`) runs the models and hands its arrays to its judge; this package never
imports torch, so a stored run can be re-decided, and the rules tested, without it
(tests/test_judges.py imports it with torch blocked and re-decides stored reports).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..config import GateConfig
from ..gate_registry import covered
from ..verdict import GateResult, Threshold, Verdict, decide
from . import agreement, depth, export_fidelity, longgen, quality, retrieval, tasks


@dataclass(frozen=True)
class Judge:
    gate: str
    enabled: Callable[[GateConfig], bool]
    thresholds: Callable[[GateConfig, "GateResult | None"], list[Threshold]]


_MODULES = {"agreement": agreement, "depth": depth, "quality": quality, "longgen": longgen, "retrieval": retrieval,
            "tasks": tasks, export_fidelity.NAME: export_fidelity}
#: in the gates' run order (qval.gate_registry; qval.gates.GATES registers each gate with its judge's two functions)
JUDGES: tuple[Judge, ...] = tuple(Judge(name, m.enabled, m.thresholds)
                                  for name, m in covered("judge", _MODULES, "qval/judges/__init__.py"))


def thresholds_for(cfg: GateConfig, results: dict[str, GateResult]) -> list[Threshold]:
    """Every enabled gate's thresholds, in run order; a gate without a result gets the thresholds
    that fail for it (decide: missing evidence is a failure)."""
    return [t for j in JUDGES if j.enabled(cfg) for t in j.thresholds(cfg, results.get(j.gate))]


def verdict(cfg: GateConfig, results: dict[str, GateResult]) -> Verdict:
    """The run's verdict from its gates' results, as `qval gate` decides it."""
    return decide(results, thresholds_for(cfg, results))
