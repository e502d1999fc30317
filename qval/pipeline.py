"""The gate pipeline: load → calibrate → build → gates → report.

Each stage is keyed by a hash of its inputs (config section, model fingerprint, data
fingerprint, library versions) and writes into the run folder, so a re-run skips what is done
and an interrupted run resumes where it stopped. Models are loaded lazily: a run whose stages
are all finished only re-renders the report.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from . import determinism
from . import models  # locate, pick_device, compute_dtype_for looked up at call time (tests replace models.locate)
from .calibration import auto_batch_size, calibration_batches, calibration_samples  # noqa: F401  (re-exported)
from .config import GateConfig
from .data import dataset_identity
from .diagnostics.stage import run_diagnostics
from .engines.base import BuildContext
from .engines.builders import ENGINES, engine_identity
from .engines.hf import HFEngine
from .engines.registry import needs_calibration
from .gates import GATES, GateContext
from .io import atomic_write_json, read_json
from .models import LoadedModel, environment, load_model
from .progress import SILENT, Progress
from .quantize import modelopt_adapter  # its functions looked up at call time (tests replace save_state)
from .report import schema, write_reports
from .stages import RunDir, Stage
from .verdict import GateResult, Verdict, decide


@dataclass
class RunResult:
    config: GateConfig
    verdict: Verdict
    run_dir: Path
    report: dict[str, Any]

    @property
    def exit_code(self) -> int:
        return 0 if self.verdict.approved else 1


@dataclass
class Session:
    """State shared by the stages of one run; models load on first use."""

    config: GateConfig
    run: RunDir
    progress: Progress
    env: dict[str, Any] = field(default_factory=environment)
    _reference: LoadedModel | None = None
    _candidate: Any = None
    _ref_engine: Any = None

    @property
    def reference(self) -> LoadedModel:
        if self._reference is None:
            self.progress.log(f"loading reference model ({self.config.model.source}) …")
            self._reference = load_model(self.config.model)
        return self._reference

    @staticmethod
    def device_of(cfg: GateConfig) -> str:
        """The device the reference will compute on, without loading it."""
        return models.pick_device(cfg.model.device)

    def reference_identity(self) -> dict[str, Any]:
        """Model fingerprint, compute dtype and device, without loading the model."""
        m = self.config.model
        device = models.pick_device(m.device)
        dtype, _ = models.compute_dtype_for(m.dtype, device)
        out = {"fingerprint": models.locate(m)[3], "device": device, "dtype": str(dtype), "trust_remote_code": m.trust_remote_code}
        if (numerics := determinism.key(device)) is not None:  # CUDA only: a CPU run's keys are unchanged
            out["numerics"] = numerics
        return out

    def versions(self) -> dict[str, Any]:
        v = self.env["versions"]
        return {k: v.get(k) for k in ("torch", "transformers", "nvidia-modelopt", "qval")}

    @property
    def ref_engine(self) -> Any:
        if self._ref_engine is None:
            self._ref_engine = HFEngine(self.reference.model, self.reference.tokenizer, notes=self.reference.notes)
        return self._ref_engine


def calibrate(s: Session, alpha: float | None = None) -> Stage | None:
    """Run (or reuse) calibration; returns the stage whose folder holds `quant_state.pt`."""
    q = s.config.quant
    if not q.spec.quantizes or not needs_calibration(s.config.engine.backend):
        return None
    c = s.config.calibration
    stage = s.run.stage("calibrate", {
        "quant": q.model_dump(mode="json"), "alpha": alpha, "calibration": c.model_dump(mode="json"),
        "data": dataset_identity(c.dataset, s.config.resolve(c.dataset)), "model": s.reference_identity(),
        "versions": s.versions(), "seed": s.config.seed,
    })
    if stage.is_done():
        s.run.record(stage, cached=True)
        s.progress.log("calibrate: done earlier with the same inputs, reused")
        return stage
    modelopt_adapter.check_supported(q, s.reference.device)
    batches, info = calibration_batches(s)
    started = stage.begin()
    torch.manual_seed(s.config.seed)
    model = copy.deepcopy(s.reference.model)
    with s.progress.task(f"calibrate {q.format.value} ({info['samples_used']}×{c.seq_len} tokens)", len(batches)) as advance:
        facts = modelopt_adapter.quantize(model, q, batches, s.reference.device, alpha=alpha, on_batch=lambda i: advance(1))
    saved = modelopt_adapter.save_state(model, s.reference.model.state_dict(), stage.path / "quant_state.pt")
    del model
    stage.finish(started, {"calibration": info, "quantizers_enabled": facts["quantizers_enabled"],
                           "calibration_seconds": facts["seconds"], "saved": saved, "mtq_config": facts["mtq_config"]})
    s.run.record(stage, cached=False)
    return stage


def candidate_identity(s: Session, calib: Stage | None) -> dict[str, Any]:
    return {"quant": s.config.quant.model_dump(mode="json"), "calibration": calib.key if calib else None,
            "engine": s.config.engine.model_dump(mode="json"), **engine_identity(s.config)}


def build(s: Session, calib: Stage | None) -> Any:
    if s._candidate is None:
        builder = ENGINES.get(s.config.engine.backend)
        s.progress.log(f"build: {s.config.engine.backend} candidate")
        ctx = BuildContext(config=s.config, reference=s.reference, calib_state=calib.path / "quant_state.pt" if calib else None,
                           run_dir=s.run.path, log=s.progress.log)
        s._candidate = builder(ctx)
    return s._candidate


def run_gates(s: Session, calib: Stage | None, fail_fast: bool = False) -> dict[str, GateResult]:
    """Every enabled gate in order. With `fail_fast`, once a gate fails its own checks the later
    gates are not run: they are recorded as "skipped" and their checks fail, so the verdict is the
    same REJECT, reached without the cost of the rest (a sweep's 4-bit candidates on a small model)."""
    results: dict[str, GateResult] = {}
    shared = s.run.path.parent / ".reference"  # next to the run folders (--out or report.dir), shared by every candidate
    rejected_by: str | None = None
    for spec in GATES.ordered():
        if not spec.enabled(s.config):
            continue
        if rejected_by is not None:
            results[spec.name] = GateResult(spec.name, "skipped", error=f"not run (--fail-fast): gate {rejected_by} already "
                                                                        "rejected the candidate")
            s.progress.log(f"gate {spec.name}: skipped, gate {rejected_by} already rejected the candidate (--fail-fast)")
            continue
        stage = s.run.stage(f"gate_{spec.name}", {
            "gate": spec.inputs(s.config), "model": s.reference_identity(), "candidate": candidate_identity(s, calib),
            "versions": s.versions(), "seed": s.config.seed, "upstream": {n: s.run.log.get(f"gate_{n}", {}).get("key") for n in spec.needs},
        })
        if stage.is_done():
            result = GateResult.from_dict(read_json(stage.path / "result.json"))
            s.run.record(stage, cached=True)
            s.progress.log(f"gate {spec.name}: done earlier with the same inputs, reused")
        else:
            candidate = build(s, calib)
            started = stage.begin()
            torch.manual_seed(s.config.seed)
            ctx = GateContext(config=s.config, reference=s.ref_engine, candidate=candidate, tokenizer=s.reference.tokenizer,
                              folder=stage.path, shared_cache=shared, reference_fingerprint=s.reference.fingerprint,
                              progress=s.progress, upstream=results)
            result = spec.run(ctx)
            atomic_write_json(stage.path / "result.json", result.to_dict())
            stage.finish(started, {"status": result.status})
            s.run.record(stage, cached=False)
        results[spec.name] = result
        if fail_fast and not decide({spec.name: result}, spec.thresholds(s.config, result)).approved:
            rejected_by = spec.name
    return results


def thresholds_for(cfg: GateConfig, results: dict[str, GateResult]) -> list[Any]:
    out = []
    for spec in GATES.ordered():
        if spec.enabled(cfg):
            out.extend(spec.thresholds(cfg, results.get(spec.name)))
    return out


def run_gate(cfg: GateConfig, progress: Progress = SILENT, out_dir: str | None = None, alpha: float | None = None,
             sensitivity: str | None = None, reference: LoadedModel | None = None, fail_fast: bool = False) -> RunResult:
    """The whole gate for one candidate configuration; writes report.json/.md/.html and layers.csv.
    `sensitivity` (auto/always/never) overrides diagnostics.sensitivity (the fallback needs it);
    `reference`: an already loaded reference (a sweep loads it once for every candidate);
    `fail_fast`: stop running gates once one rejects (see run_gates)."""
    t0 = time.perf_counter()
    # before any model loads (a sweep's reference was loaded through load_model, which did the same)
    determinism.configure(reference.device if reference is not None else Session.device_of(cfg))
    root = Path(out_dir or cfg.report.dir)
    s = Session(config=cfg, run=RunDir(root, cfg.name), progress=progress, _reference=reference)
    calib = calibrate(s, alpha)
    results = run_gates(s, calib, fail_fast)
    verdict = decide(results, thresholds_for(cfg, results))
    mode = sensitivity or cfg.diagnostics.sensitivity
    diagnostics = run_diagnostics(s, calib, mode == "always" or (mode == "auto" and not verdict.approved))
    report = schema.build_report(cfg, verdict, results, reference=reference_description(s),
                                 engine=s._candidate.describe() if s._candidate is not None else None,
                                 calibration=calib.meta() if calib else None, stages=s.run.log, environment=s.env,
                                 numerics=determinism.describe(), diagnostics=diagnostics, seconds=time.perf_counter() - t0)
    write_reports(s.run.path, report)
    return RunResult(config=cfg, verdict=verdict, run_dir=s.run.path, report=report)


def expand_alphas(cfg: GateConfig) -> list[tuple[GateConfig, float | None]]:
    """A list of SmoothQuant alphas is a sweep: one candidate per alpha, named after it."""
    q = cfg.quant
    if not q.spec.takes_smoothquant_alpha:
        return [(cfg, None)]
    if not isinstance(q.smoothquant_alpha, list):
        return [(cfg, q.alphas[0])]
    out = []
    for a in q.smoothquant_alpha:
        c = cfg.model_copy(update={"name": f"{cfg.name}-alpha{a:g}", "quant": q.model_copy(update={"smoothquant_alpha": a})})
        out.append((c, a))
    return out


def reference_description(s: Session) -> dict[str, Any]:
    """The reference as the report names it. A run whose every stage was reused never loads the
    model; it then repeats the description saved by the run that did (see schema.unloaded_reference)."""
    path = s.run.path / "reference.json"
    if s._reference is not None:
        d = s._reference.describe()
        atomic_write_json(path, d)
        return d
    try:
        saved = read_json(path) if path.is_file() else None
    except (OSError, ValueError):
        saved = None
    return schema.unloaded_reference(saved, s.reference_identity()["fingerprint"])
