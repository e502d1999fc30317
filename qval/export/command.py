"""`qval build`: calibrate (or reuse the calibration), export, check fidelity.

A command on top of the pipeline (its session and calibrate stage) and of the build stage in
`build.py`, which the export engines also run; kept apart from it so that the engines do not
depend on the pipeline that runs them.
"""

from __future__ import annotations

from typing import Any

from .. import pipeline  # looked up at call time, as before (tests replace pipeline.calibrate)
from ..config import GateConfig
from ..errors import StageError
from ..io import atomic_write_json
from ..models import LoadedModel
from .build import BuildResult, ExportOptions, build_export, fidelity_summary


def run_build(cfg: GateConfig, progress: Any, out_dir: str | None, alpha: float | None, options: ExportOptions,
              reference: LoadedModel | None = None) -> BuildResult:
    """`qval build`: calibrate (or reuse the calibration), export, check fidelity; the fidelity
    report is also written as `<run>/build.json` beside the stages."""
    if not cfg.quant.spec.quantizes:
        raise StageError(f"{cfg.source_file}: quant.format is {cfg.quant.format.value}; there is no quantized checkpoint to build.")
    s = pipeline.Session.open(cfg, out_dir, progress, loaded=reference)
    stage = pipeline.calibrate(s, alpha)
    result = build_export(cfg, s.ref.model, stage.path / "quant_state.pt" if stage else None, s.run.path, options, progress.log)
    atomic_write_json(s.run.path / "build.json", {"config": cfg.name, "export": result.export,
                                                  "fidelity": fidelity_summary(result.fidelity), "passed": result.passed})
    return result
