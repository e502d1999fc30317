"""The export_fidelity gate's judge: no failed fidelity check of the exported checkpoint and no weight
that decodes to another value than the calibrated quantizer gives (qval.export.gate reads the fidelity
report the engine's build produced).

Torch-free: a test imports it with torch blocked.
"""

from __future__ import annotations

from ...config import GateConfig
from ...verdict import CheckKey, GateResult, Threshold

EXPORTING_BACKENDS = ("export", "tensorrt_llm")
NAME = "export_fidelity"


def enabled(cfg: GateConfig) -> bool:
    return cfg.engine.backend in EXPORTING_BACKENDS


def thresholds(cfg: GateConfig, result: GateResult | None) -> list[Threshold]:
    return [Threshold(CheckKey(NAME, "failed_checks"), "max", 0, "fidelity checks of the exported checkpoint that failed"),
            Threshold(CheckKey(NAME, "weight_mismatches"), "max", 0, "exported weights that decode to another value than the calibrated quantizer's")]
