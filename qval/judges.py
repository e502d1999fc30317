"""Judging without torch: each gate's judge turns what the gate measured into figures (its summaries)
and the config's limits into `Threshold`s; `verdict` decides a whole run from stored results.

Each gate's judge is its package's `judge.py` (`qval/gates/<name>/judge.py`); its `run.py` runs the models and
hands its arrays to the judge. `JUDGES` holds every gate `qval.gate_registry` declares, in run order. No judge
imports torch, so a stored run can be re-decided, and the rules tested, without it (tests/test_judges.py imports
this module with torch blocked and re-decides stored reports).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .config import GateConfig
from .gate_registry import parts
from .verdict import GateResult, Threshold, Verdict, decide


@dataclass(frozen=True)
class Judge:
    gate: str
    enabled: Callable[[GateConfig], bool]
    thresholds: Callable[[GateConfig, "GateResult | None"], list[Threshold]]


#: in the gates' run order (each gate's `GateSpec` in `qval.gates.GATES` carries the same two functions)
JUDGES: tuple[Judge, ...] = tuple(Judge(d.name, m.enabled, m.thresholds) for d, m in parts("judge"))


def thresholds_for(cfg: GateConfig, results: dict[str, GateResult]) -> list[Threshold]:
    """Every enabled gate's thresholds, in run order; a gate without a result gets the thresholds
    that fail for it (decide: missing evidence is a failure)."""
    return [t for j in JUDGES if j.enabled(cfg) for t in j.thresholds(cfg, results.get(j.gate))]


def verdict(cfg: GateConfig, results: dict[str, GateResult]) -> Verdict:
    """The run's verdict from its gates' results, as `qval gate` decides it."""
    return decide(results, thresholds_for(cfg, results))
