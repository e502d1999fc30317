"""Gate 1, logits agreement: the candidate's next-token distributions against the reference's, teacher-forced
on held-out text.

Its parts are this package's modules: `config` (its section), `metrics` (its table), `result` (its details type),
`judge`, `section` (its part of the report) and `run` (the models). This module declares it; `qval.gate_registry`
registers it. Torch-free: it loads its config and table only.
"""

from __future__ import annotations

from ...gate_decl import GateDecl
from .config import AgreementGate
from .metrics import AGREEMENT

GATE = GateDecl("agreement", "Gate 1 — logits agreement", __name__, AGREEMENT, AgreementGate, section_order=1,
                enabled_by_default=True)
