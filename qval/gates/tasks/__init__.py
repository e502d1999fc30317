"""Gate 4, answers item by item: both models answer the same items of each suite (built in, golden files,
lm-evaluation-harness tasks), gated per suite.

Its parts are this package's modules: `config` (its section), `metrics` (its table), `result` (its details type),
`judge`, `section` (its part of the report) and `run` (the models). This module declares it; `qval.gate_registry`
registers it. Torch-free: it loads its config and table only.
"""

from __future__ import annotations

from ...gate_decl import GateDecl
from .config import TasksGate
from .metrics import TASKS

GATE = GateDecl("tasks", "Gate 4 — answers, item by item", __name__, TASKS, TasksGate, section_order=6)
