"""The `export_fidelity` gate: an export that does not hold the calibrated model is a REJECT.

It runs for every backend that gates an export (`EXPORTING_BACKENDS` of `qval.gates.export_fidelity.judge`) and
reads the fidelity report the engine's build produced. Its checks: no failed fidelity check, no weight that
decodes to another value than the calibrated quantizer gives (rounding-midpoint ties excepted,
see `qval.export.fidelity`).
"""

from __future__ import annotations

from typing import Any

from ..config import GateConfig
from ..gates.base import GateContext, GateSpec
from ..metrics.estimate import Estimate
from ..gates.export_fidelity.judge import NAME, enabled, thresholds
from ..gates.export_fidelity.result import ExportFidelityDetails
from ..results import parse
from ..verdict import GateResult


def run(ctx: GateContext) -> GateResult:
    fid = getattr(ctx.candidate, "fidelity", None)
    if not fid:
        return GateResult(NAME, "error", error=f"engine {ctx.config.engine.backend} produced no fidelity report")
    totals = fid.get("totals", {})
    failed = [c for c in fid.get("checks", []) if not c["ok"] and c["severity"] == "error"]
    measurements = {
        "failed_checks": Estimate(value=float(len(failed)), n=len(fid.get("checks", []))),
        "weight_mismatches": Estimate(value=float(totals.get("mismatches", 0)) if totals else float("nan"), n=totals.get("n")),
    }
    kept = {k: v for k, v in fid.items() if k not in ("layers", "key")}
    notes = [f"{c['name']}: {c['detail']}" for c in fid.get("checks", []) if not c["ok"]]
    details = parse(ExportFidelityDetails, {**kept, "notes": notes}, f"engine {ctx.config.engine.backend}'s fidelity report")
    return GateResult(NAME, "ok", measurements=measurements, details=details)


def inputs(cfg: GateConfig) -> dict[str, Any]:
    return {"engine": cfg.engine.model_dump(mode="json")}


SPEC = GateSpec(NAME, run, thresholds, inputs, enabled)
