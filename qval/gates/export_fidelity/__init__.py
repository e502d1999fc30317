"""The export backends' fidelity check: the exported checkpoint read back and compared with the calibrated model
(enabled for those backends only). It has no config section and fixed limits.

Its parts are this package's modules `result`, `judge` and `section`; it runs in `qval.export.gate`, beside the
export it checks. This module declares it; `qval.gate_registry` registers it.
"""

from __future__ import annotations

from ...gate_decl import GateDecl

GATE = GateDecl("export_fidelity", "export_fidelity", __name__, run="qval.export.gate")
