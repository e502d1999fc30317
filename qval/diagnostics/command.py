"""`qval diagnose`: calibrate (or reuse), run the diagnose and sensitivity stages, no gates.

A command on top of the pipeline (its session and calibrate stage) and of the diagnostics
stages, kept apart from `stage.py`, which the pipeline itself runs for every gate report.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..backends import needs_calibration
from ..errors import ConfigError
from ..io import atomic_write_json, atomic_write_text
from .. import pipeline  # looked up at call time, as before (tests replace pipeline.calibrate)
from ..report import schema
from ..report.html import render_html
from .stage import layers_csv, run_diagnostics


def diagnose_run(cfg: Any, progress: Any, out_dir: str | None, alpha: float | None) -> tuple["Path", dict[str, Any]]:
    """`qval diagnose`: calibrate (or reuse), diagnose, rank; no gates. Writes diagnostics.json,
    layers.csv and diagnostics.html into the run folder (never report.*: that is a sign-off)."""
    if not cfg.quant.spec.quantizes:
        raise ConfigError(f"{cfg.source_file or cfg.name}: quant.format is {cfg.quant.format.value}, so there are no quantizers to diagnose.")
    if not needs_calibration(cfg.engine.backend, cfg.engine.options):
        raise ConfigError(f"{cfg.source_file or cfg.name}: engine backend {cfg.engine.backend!r} gates a checkpoint made "
                          f"elsewhere, with no qval calibration, so there are no quantizer scales to diagnose. "
                          f"`qval gate` gates it; to diagnose the format, run `qval diagnose` on a config with "
                          f"engine backend fakequant.")
    cfg = cfg.model_copy(update={"diagnostics": cfg.diagnostics.model_copy(update={"enabled": True})})
    s = pipeline.Session.open(cfg, out_dir, progress)
    calib = pipeline.calibrate(s, alpha)
    diagnostics = run_diagnostics(s, calib, cfg.diagnostics.sensitivity != "never")
    diagnostics["layers_csv"] = "layers.csv"
    page = schema.diagnostics_page(cfg, reference=s.ref.described(), calibration=calib.meta(), diagnostics=diagnostics,
                                   stages=s.run.log, environment=s.env)
    atomic_write_text(s.run.path / "layers.csv", layers_csv(diagnostics["layers"]))
    atomic_write_json(s.run.path / "diagnostics.json", page)
    atomic_write_text(s.run.path / "diagnostics.html", render_html(page))
    return s.run.path, diagnostics
