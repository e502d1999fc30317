"""Gate 1 at depth: teacher-forced agreement on long documents at a long context, per depth bucket.

Its parts are this package's modules: `config` (its section), `metrics` (its table), `result` (its details type),
`judge`, `section` (its part of the report) and `run` (the models). This module declares it; `qval.gate_registry`
registers it. Torch-free: it loads its config and table only.
"""

from __future__ import annotations

from ...gate_decl import GateDecl
from .config import DepthGate
from .metrics import DEPTH

GATE = GateDecl("depth", "Gate 1 at depth — long context", __name__, DEPTH, DepthGate, section_order=4)
