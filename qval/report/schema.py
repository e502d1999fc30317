"""The structure of report.json (a gate's sign-off) and of diagnostics.json (`qval diagnose`'s
page): every key is written here, from plain inputs the stages hand over, so the schema has one
home and its version one place to change. The renderers read what these functions write."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from ..config import GateConfig
from ..data import dataset_identity
from ..io import hash_json
from ..quantize.formats import FORMATS
from ..verdict import GateResult, Verdict
from .measured_error_rates import for_report, measured_key, run_configuration

SCHEMA, SCHEMA_VERSION = "qval.report", 1
DIAGNOSTICS_SCHEMA, DIAGNOSTICS_SCHEMA_VERSION = "qval.diagnostics", 1


def now() -> str:
    """The report's creation time: UTC, to the second."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def data_identities(cfg: GateConfig, gates: dict[str, Any]) -> dict[str, Any]:
    """Every data set the run read, with its content hash: the calibration's, then each gate's
    (`gates`: by gate name in run order, as `qval.gates.data_identities` gives them)."""
    out: dict[str, Any] = {}
    if cfg.calibrates:  # a checkpoint's or a server's own model read no calibration data
        out["calibration"] = dataset_identity(cfg.calibration.dataset, cfg.resolve(cfg.calibration.dataset))
    return out | gates


def unloaded_reference(saved: Any, fingerprint: str) -> dict[str, Any]:
    """The reference of a run that never loaded it (every stage reused): the description saved by
    the run that did, when it is of the same model, marked "loaded": False; else the fingerprint
    alone, rather than a report with the model's name and dtype made up.

    >>> unloaded_reference({"name": "m", "fingerprint": "ab"}, "ab")
    {'name': 'm', 'fingerprint': 'ab', 'loaded': False}
    >>> unloaded_reference({"name": "m", "fingerprint": "cd"}, "ab")
    {'fingerprint': 'ab', 'loaded': False}
    """
    if isinstance(saved, dict) and saved.get("fingerprint") == fingerprint:
        return {**saved, "loaded": False}
    return {"fingerprint": fingerprint, "loaded": False}


def _quant(cfg: GateConfig) -> dict[str, Any]:
    q = cfg.quant
    return {"format": q.format.value, "kv_cache": q.kv_cache.value, "exclude": q.exclude}


def candidate(cfg: GateConfig, engine: dict[str, Any] | None) -> dict[str, Any]:
    """The candidate as the report names it; `engine` is the built engine's describe(), None when
    no gate needed it built (every gate reused)."""
    fmt = FORMATS.get(cfg.quant.format.value)
    return {**_quant(cfg), "weight_bits": fmt.bits(cfg.quant), "activation_bits": fmt.activation_bits,
            "engine": engine if engine is not None else {"backend": cfg.engine.backend, "built": False}}


def build_report(cfg: GateConfig, verdict: Verdict, results: dict[str, GateResult], *, reference: dict[str, Any],
                 engine: dict[str, Any] | None, calibration: dict[str, Any] | None, stages: dict[str, Any],
                 environment: dict[str, Any], numerics: dict[str, Any], diagnostics: dict[str, Any] | None,
                 seconds: float, data: dict[str, Any]) -> dict[str, Any]:
    """report.json of one gate run. `reference`: the reference model's description; `calibration`:
    the calibrate stage's record (None for an uncalibrated candidate); `stages`: the run's stage
    log; `numerics`: determinism.describe(); `seconds`: the run's wall time; `data`: each enabled
    gate's data identity (`qval.gates.data_identities`)."""
    config = cfg.model_dump(mode="json")
    return {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "created": now(),
        "name": cfg.name,
        "description": cfg.description,
        "verdict": (v := verdict.to_dict()),
        "error_rates": for_report(measured_key(cfg.name, cfg.source_file), v["checks"], run_configuration(cfg, reference)),
        "config": config,
        "config_hash": hash_json(config),
        "config_file": cfg.source_file,
        "model": reference,
        "candidate": candidate(cfg, engine),
        "calibration": calibration,
        "data": data_identities(cfg, data),
        "gates": {k: v.to_dict() for k, v in results.items()},
        "stages": stages,
        "environment": {**environment, "determinism": numerics},
        "seconds": round(seconds, 2),
        "diagnostics": diagnostics,
    }


def with_fallback(report: dict[str, Any], record: dict[str, Any]) -> dict[str, Any]:
    """The starting run's report with the fallback's outcome added (fallback.json's record, each
    step without its full list of checks: the step's own run folder has its report)."""
    return {**report, "fallback": {k: v for k, v in record.items() if k != "steps"} | {
        "steps": [{k: v for k, v in s.items() if k != "checks"} for s in record["steps"]]}}


def diagnostics_page(cfg: GateConfig, *, reference: dict[str, Any], calibration: dict[str, Any], diagnostics: dict[str, Any],
                     stages: dict[str, Any], environment: dict[str, Any]) -> dict[str, Any]:
    """diagnostics.json of `qval diagnose`: the run's parts without a verdict (it is no sign-off)."""
    return {"schema": DIAGNOSTICS_SCHEMA, "schema_version": DIAGNOSTICS_SCHEMA_VERSION, "name": cfg.name,
            "description": cfg.description, "created": now(), "config": cfg.model_dump(mode="json"), "model": reference,
            "candidate": {**_quant(cfg), "engine": {"backend": cfg.engine.backend}}, "calibration": calibration,
            "diagnostics": diagnostics, "stages": stages, "environment": environment}


def shortfalls(report: dict[str, Any]) -> list[str]:
    """Every budget the run scored less of than configured (calibration, each gate), as the
    stages recorded it: the verdict rests on less data than the config asked for.

    >>> shortfalls({"calibration": {"calibration": {"shortfall": "6 of 8 samples"}}, "gates": {"agreement": {"details": {}}}})
    ['calibration: 6 of 8 samples']
    """
    calib = ((report.get("calibration") or {}).get("calibration") or {}).get("shortfall")
    notes = [f"calibration: {calib}"] if calib else []
    for name, g in (report.get("gates") or {}).items():
        if (note := (g.get("details") or {}).get("shortfall")):
            notes.append(f"gate {name}: {note}")
    return notes
