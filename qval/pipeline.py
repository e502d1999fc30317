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

from . import determinism, judges
from . import models  # locate, pick_device, compute_dtype_for looked up at call time (tests replace models.locate)
from .calibration import auto_batch_size, calibration_batches, calibration_samples, expand_alphas  # noqa: F401  (re-exported)
from .checksum import checksums
from .config import GateConfig
from .data import dataset_identity
from .diagnostics.stage import run_diagnostics
from .engines.base import BuildContext
from .engines.builders import BUILDERS, engine_identity
from .engines.hf import HFEngine
from .engines.served_reference import fingerprint as served_fingerprint, load_served_reference
from .errors import ConfigError
from .gates import GATES, GateContext
from .io import atomic_write_json, read_json
from .memory import PhaseMemory, free_memory
from .models import LoadedModel, environment, load_model
from .progress import SILENT, Progress
from .quantize import modelopt_adapter  # its functions looked up at call time (tests replace save_state)
from .report import schema, write_reports
from .snapshot.engine import SnapshotReference
from .snapshot.fill import fill_gates
from .snapshot.store import SnapshotStore
from .stages import KEY_PACKAGES, RunDir, Stage
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
    _snapshot: Any = None
    #: how the reference is (re)loaded: a sequential run loads it once per phase
    loader: Any = None
    #: kept when the reference leaves memory (a sequential run): what the gates read besides outputs
    _tokenizer: Any = None
    _ref_described: dict[str, Any] | None = None
    fill: dict[str, Any] | None = None  # a sequential run's first phase: each gate's reference work
    _engine_identity: dict[str, Any] | None = None  # what the backend adds to the stage keys, asked once
    _served_fingerprint: str | None = None  # a served reference's identity, asked of its server once

    @property
    def served(self) -> bool:  # the reference is served (model.source: served): no weights here, no snapshot
        return self.config.model.source == "served"

    @property
    def reference(self) -> LoadedModel:
        if self._reference is None:
            self.progress.log(f"loading reference model ({self.config.model.source}) …")
            if self.served:  # its identity, asked of its server once for the stage keys, goes with it
                fp = self.reference_identity()["fingerprint"]
                self._reference = load_served_reference(self.config, self.run.path, self.progress.log, fp)  # type: ignore[assignment]
            else:
                self._reference = self.loader() if self.loader is not None else load_model(self.config.model)
            self._tokenizer = self._reference.tokenizer
        return self._reference

    @property
    def ref_fingerprint(self) -> str:
        """The reference's fingerprint, without reloading it once a sequential run released it."""
        if self._reference is not None:
            return self._reference.fingerprint
        if self._ref_described is not None:
            return str(self._ref_described["fingerprint"])
        return self.reference.fingerprint

    def reference_described(self) -> dict[str, Any]:
        """The reference's description, without reloading a reference a sequential run released."""
        if self._reference is None and self._ref_described is not None:
            return dict(self._ref_described)
        return self.reference.describe()

    @property
    def sequential(self) -> bool:
        return self.config.snapshot.enabled and self.config.snapshot.sequential and not self.served

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer if self._tokenizer is not None else self.reference.tokenizer

    def release_reference(self, why: str) -> None:
        """A sequential run's reference leaves memory (its weights consumed by calibration or the
        candidate, or no longer needed): what the gates read besides its outputs is kept."""
        if self._reference is not None:
            self._ref_described = self._reference.describe()
        self._reference = None
        self._ref_engine = None
        if self._snapshot is not None:
            self._snapshot.detach()
        free_memory()
        self.progress.log(f"reference released ({why})")

    @staticmethod
    def device_of(cfg: GateConfig) -> str:
        """The device the reference will compute on, without loading it."""
        return models.pick_device(cfg.model.device)

    def reference_identity(self) -> dict[str, Any]:
        """Model fingerprint, compute dtype and device, without loading the model."""
        m = self.config.model
        if self.served:
            self._served_fingerprint = self._served_fingerprint or served_fingerprint(self.config)
            return {"fingerprint": self._served_fingerprint, "device": "server", "dtype": "served"}
        device = models.pick_device(m.device)
        dtype, _ = models.compute_dtype_for(m.dtype, device)
        out = {"fingerprint": models.locate(m)[3], "device": device, "dtype": str(dtype), "trust_remote_code": m.trust_remote_code}
        if (numerics := determinism.key(device)) is not None:  # CUDA only: a CPU run's keys are unchanged
            out["numerics"] = numerics
        return out

    def versions(self) -> dict[str, Any]:
        v = self.env["versions"]  # stages.versions(), read once per run with the report's environment
        return {k: v.get(k) for k in KEY_PACKAGES}

    @property
    def ref_engine(self) -> Any:
        if self._ref_engine is None:  # a served reference's is its own
            self._ref_engine = (self.reference.engine if self.served  # type: ignore[attr-defined]
                                else HFEngine(self.reference.model, self.reference.tokenizer, notes=self.reference.notes))
        return self._ref_engine

    def snapshot_inputs(self) -> dict[str, Any]:
        """What the snapshot folder's key hashes: the reference's identity, the versions, the stored form."""
        return {"reference": self.reference_identity(), "versions": self.versions(), "topk": self.config.snapshot.k}

    def gate_reference(self, shared: Path, in_memory: bool = True) -> Any:
        """The reference engine the gates use: the snapshot's (the default) or the model itself.
        `in_memory` False (a sequential run's candidate phase): the snapshot alone, no model; a served reference, live."""
        if not self.config.snapshot.enabled or self.served:
            return self.ref_engine
        if self._snapshot is None:
            snap = self.config.snapshot
            self._snapshot = SnapshotReference(self.ref_engine, SnapshotStore(shared, self.snapshot_inputs()), snap.k, snap.audit)
        if in_memory and self._snapshot.real is None:
            self._snapshot.attach(self.ref_engine)
        return self._snapshot

    def snapshot_description(self) -> dict[str, Any] | None:
        """The snapshot the gates read (`SnapshotStore.describe`), this run's use of it and what its reads verified;
        with every gate reused (none ran here), the snapshot their stage keys name, unused in this run."""
        if self._snapshot is None and (not self.config.snapshot.enabled or self.served):
            return None
        snap = self._snapshot or SnapshotReference(None, SnapshotStore(self.run.path.parent / ".reference", self.snapshot_inputs()),
                                                   None, False, description={})
        return {**snap.store.describe(self.config.snapshot.topk), **snap.usage(), **snap.store.integrity()}


def calibrate(s: Session, alpha: float | None = None) -> Stage | None:
    """Run (or reuse) calibration; returns the stage whose folder holds `quant_state.pt`."""
    q = s.config.quant
    if not s.config.calibrates:
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
    with PhaseMemory() as mem:
        # a sequential run calibrates the reference's own weights (a copy would double the memory) and reloads it
        model = s.reference.model if s.sequential else copy.deepcopy(s.reference.model)
        before = checksums(model.state_dict()) if s.sequential else s.reference.model.state_dict()
        what = "the FP8 KV cache (weights as they are)" if q.kv_only else q.format.value
        with s.progress.task(f"calibrate {what} ({info['samples_used']}×{c.seq_len} tokens)", len(batches)) as advance:
            facts = modelopt_adapter.quantize(model, q, batches, s.reference.device, alpha=alpha, on_batch=lambda i: advance(1))
        saved = modelopt_adapter.save_state(model, before, stage.path / "quant_state.pt")
        del model
        if s.sequential:
            s.release_reference("its weights were calibrated in place")
    stage.finish(started, {"calibration": info, "quantizers_enabled": facts["quantizers_enabled"],
                           "calibration_seconds": facts["seconds"], "saved": saved, "mtq_config": facts["mtq_config"],
                           "memory": mem.describe()})
    s.run.record(stage, cached=False)
    return stage


def candidate_identity(s: Session, calib: Stage | None) -> dict[str, Any]:
    if s._engine_identity is None:  # a served engine's asks its server
        s._engine_identity = engine_identity(s.config)
    return {"quant": s.config.quant.model_dump(mode="json"), "calibration": calib.key if calib else None,
            "engine": s.config.engine.model_dump(mode="json"), **s._engine_identity}


def build(s: Session, calib: Stage | None) -> Any:
    if s._candidate is None:
        builder = BUILDERS.get(s.config.engine.backend)
        s.progress.log(f"build: {s.config.engine.backend} candidate")
        ctx = BuildContext(config=s.config, reference=s.reference, calib_state=calib.path / "quant_state.pt" if calib else None,
                           run_dir=s.run.path, log=s.progress.log, consume_reference=s.sequential)
        s._candidate = builder(ctx)
        if s.sequential:  # the candidate holds the reference's weights now (or its own): the reference leaves
            s.release_reference("the candidate was built from its weights")
    return s._candidate


def run_gates(s: Session, calib: Stage | None, fail_fast: bool = False) -> dict[str, GateResult]:
    """Every enabled gate in order. With `fail_fast`, once a gate fails its own checks the later
    gates are not run: they are recorded as "skipped" and their checks fail, so the verdict is the
    same REJECT, reached without the cost of the rest (a sweep's 4-bit candidates on a small model)."""
    results: dict[str, GateResult] = {}
    shared = s.run.path.parent / ".reference"  # next to the run folders (--out or report.dir), shared by every candidate
    rejected_by: str | None = None
    pending: list[tuple[Any, ...]] = []
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
            "versions": s.versions(), "seed": s.config.seed, "snapshot": s.config.snapshot.model_dump(mode="json"),
            "upstream": {n: s.run.log.get(f"gate_{n}", {}).get("key") for n in spec.needs},
        })
        if stage.is_done():
            result = GateResult.from_dict(read_json(stage.path / "result.json"))
            result.folder = stage.path  # its own files, for the gates that read them (GateContext.upstream)
            s.run.record(stage, cached=True)
            s.progress.log(f"gate {spec.name}: done earlier with the same inputs, reused")
        else:
            with PhaseMemory() as mem:  # the gate's peak (the first gate's includes building the candidate)
                candidate = build(s, calib)
                started = stage.begin()
                torch.manual_seed(s.config.seed)
                reference = s.gate_reference(shared, in_memory=not s.sequential)
                before = reference.usage() if hasattr(reference, "usage") else None
                ctx = GateContext(config=s.config, reference=reference, candidate=candidate, tokenizer=s.tokenizer,
                                  folder=stage.path, shared_cache=shared, reference_fingerprint=s.ref_fingerprint,
                                  progress=s.progress, upstream=results)
                result = spec.run(ctx)
            if result.status == "pending":  # finished once the reference is back (a sequential run's last phase)
                pending.append((spec, stage, started, ctx, before, mem))
                results[spec.name] = result
                continue
            _finish(s, stage, started, result, reference, before, mem)
        results[spec.name] = result
        if fail_fast and not decide({spec.name: result}, spec.thresholds(s.config, result)).approved:
            rejected_by = spec.name
    if pending:
        # the candidate leaves (every reference to it: the session's, the gates' contexts, this loop's),
        # the reference comes back: one model in memory at a time
        for entry in pending:
            entry[3].candidate = None
        if hasattr(s._candidate, "release"):
            s._candidate.release()
        s._candidate = candidate = ctx = None  # noqa: F841
        free_memory()
        reference = s.gate_reference(shared, in_memory=True)
        for spec, stage, started, ctx, before, _ in pending:
            s.progress.log(f"gate {spec.name}: the reference finishes what needed the candidate's output")
            with PhaseMemory() as mem:
                ctx.reference = reference
                result = spec.complete(ctx, results[spec.name])
            _finish(s, stage, started, result, reference, before, mem)
            results[spec.name] = result
    return results


def _finish(s: Session, stage: Stage, started: float, result: GateResult, reference: Any, before: dict[str, Any] | None,
            mem: PhaseMemory) -> None:
    result.folder = stage.path  # its own files, for the gates that read them (GateContext.upstream)
    if before is not None:  # this gate's use of the snapshot: reference calls computed / read back
        after = reference.usage()
        result.record_snapshot_use({"key": reference.store.key, **{k: round(after[k] - before[k], 2) for k in before}})
    atomic_write_json(stage.path / "result.json", result.to_dict())
    stage.finish(started, {"status": result.status, "memory": mem.describe()})
    s.run.record(stage, cached=False)


def fill_reference(cfg: GateConfig, progress: Progress = SILENT, out_dir: str | None = None) -> dict[str, Any]:
    """`qval reference`: `fill_gates` for one config, the reference alone in memory; the snapshot's
    description and each gate's use of it."""
    check_fillable(cfg)
    determinism.configure(Session.device_of(cfg))
    s = Session(config=cfg, run=RunDir(Path(out_dir or cfg.report.dir), cfg.name), progress=progress)
    gates = fill_gates(s, s.run.path.parent / ".reference")
    return {"snapshot": s.snapshot_description(), "gates": gates}


def check_fillable(cfg: GateConfig) -> None:
    """A ConfigError when `cfg` has no reference snapshot to fill (said before any server is asked)."""
    if not cfg.snapshot.enabled:
        raise ConfigError(f"{cfg.source_file or 'the config'}: snapshot.enabled is false, so there is no reference "
                          "snapshot to fill; set it to true (the default) or run qval gate.")
    if cfg.model.source == "served":
        raise ConfigError(f"{cfg.source_file or 'the config'}: the reference is served (model.source: served): it answers "
                          "every run live and keeps no snapshot to fill; run qval gate.")


def run_gate(cfg: GateConfig, progress: Progress = SILENT, out_dir: str | None = None, alpha: float | None = None,
             sensitivity: str | None = None, reference: LoadedModel | None = None, fail_fast: bool = False,
             loader: Any = None) -> RunResult:
    """The whole gate for one candidate configuration; writes report.json/.md/.html and layers.csv.
    `sensitivity` (auto/always/never) overrides diagnostics.sensitivity (the fallback needs it);
    `reference`: an already loaded reference (a sweep loads it once for every candidate);
    `loader`: how to load the reference (default: from the config), each time a sequential run needs it;
    `fail_fast`: stop running gates once one rejects (see run_gates).

    With snapshot.sequential, one model is in memory at a time: the reference fills the snapshot
    (every gate's reference work) and leaves; calibration runs on a fresh load of its weights in
    place; the candidate is built from another fresh load (no copy); the gates read the reference
    from the snapshot alone; then the candidate leaves and the reference returns for what needed
    the candidate's output (gate 3's judge of its text)."""
    t0 = time.perf_counter()
    # before any model loads (a sweep's reference was loaded through load_model, which did the same)
    determinism.configure(reference.device if reference is not None else Session.device_of(cfg))
    if cfg.snapshot.enabled and cfg.snapshot.sequential and reference is not None:
        reference = None  # a sequential run consumes its loads in place: never a reference its caller keeps using
    root = Path(out_dir or cfg.report.dir)
    s = Session(config=cfg, run=RunDir(root, cfg.name), progress=progress, _reference=reference, loader=loader)
    if s.sequential:
        s.progress.log("sequential: the reference alone fills the snapshot first")
        with PhaseMemory() as mem:
            filled = fill_gates(s, s.run.path.parent / ".reference")
        s.fill = {"gates": filled, "memory": mem.describe()}
        s.release_reference("the snapshot holds what the gates ask of it")
    try:
        calib = calibrate(s, alpha)
        results = run_gates(s, calib, fail_fast)
        verdict = judges.verdict(cfg, results)
        mode = sensitivity or cfg.diagnostics.sensitivity
        diagnostics = run_diagnostics(s, calib, mode == "always" or (mode == "auto" and not verdict.approved))
        report = schema.build_report(cfg, verdict, results, reference=reference_description(s),
                                     engine=s._candidate.describe() if s._candidate is not None else None,
                                     calibration=calib.meta() if calib else None, stages=s.run.log, environment=s.env,
                                     numerics=determinism.describe(), diagnostics=diagnostics, seconds=time.perf_counter() - t0)
    finally:  # a server the candidate or the reference started stops on every exit path (an error, Ctrl-C)
        try:
            getattr(s._candidate, "close", lambda: None)()
        finally:
            getattr(s._reference, "close", lambda: None)()
    write_reports(s.run.path, report)
    return RunResult(config=cfg, verdict=verdict, run_dir=s.run.path, report=report)


def reference_description(s: Session) -> dict[str, Any]:
    """The reference as the report names it. A run whose every stage was reused never loads the
    model; it then repeats the description saved by the run that did (see schema.unloaded_reference)."""
    path = s.run.path / "reference.json"
    if s._reference is not None or s._ref_described is not None:
        d = s._reference.describe() if s._reference is not None else dict(s._ref_described)  # type: ignore[arg-type]
        if (snap := s.snapshot_description()) is not None:  # its notes (entries recomputed) beside the model's
            d["snapshot"], d["notes"] = snap, [*d.get("notes", []), *snap["notes"]]
        if s.fill is not None:
            d["snapshot_fill"] = s.fill
        if s.sequential:
            d["sequential"] = True
        atomic_write_json(path, d)
        return d
    try:
        saved = read_json(path) if path.is_file() else None
    except (OSError, ValueError):
        saved = None
    return schema.unloaded_reference(saved, s.reference_identity()["fingerprint"])
