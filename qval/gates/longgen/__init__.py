"""Gate 3, long-generation stability: the candidate on the reference's long greedy continuation, and the health of
its own.

Its parts are this package's modules: `config` (its section), `metrics` (its table), `result` (its details type),
`judge`, `section` (its part of the report) and `run` (the models). This module declares it; `qval.gate_registry`
registers it. Torch-free: it loads its config and table only.
"""

from __future__ import annotations

from ...gate_decl import GateDecl
from .config import LongGenGate
from .metrics import LONGGEN

GATE = GateDecl("longgen", "Gate 3 — long-generation stability", __name__, LONGGEN, LongGenGate, section_order=3)
