"""Gate 2: perplexity over gate 1's positions (it runs after gate 1) and BLEU/chrF of greedy generations.

Its parts are this package's modules: `config` (its section), `metrics` (its table), `result` (its details type),
`judge`, `section` (its part of the report) and `run` (the models). This module declares it; `qval.gate_registry`
registers it. Torch-free: it loads its config and table only.
"""

from __future__ import annotations

from ...gate_decl import GateDecl
from .config import QualityGate
from .metrics import QUALITY

#: report.html has always headed gate 2 without "/chrF"; kept so that the page stays byte-identical
GATE = GateDecl("quality", "Gate 2 — perplexity and BLEU/chrF", __name__, QUALITY, QualityGate, section_order=2,
                html_title="Gate 2 — perplexity and BLEU")
