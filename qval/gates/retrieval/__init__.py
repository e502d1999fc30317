"""The retrieval matrix: a pass code hidden at a depth of a haystack of each context length, answered by both
models, paired per trial.

Its parts are this package's modules: `config` (its section), `metrics` (its table), `result` (its details type),
`judge`, `section` (its part of the report) and `run` (the models). This module declares it; `qval.gate_registry`
registers it. Torch-free: it loads its config and table only.
"""

from __future__ import annotations

from ...gate_decl import GateDecl
from .config import RetrievalGate
from .metrics import RETRIEVAL

GATE = GateDecl("retrieval", "Retrieval matrix — context length × needle depth", __name__, RETRIEVAL, RetrievalGate,
                section_order=5)
