"""The gate pipeline: load → calibrate → build → gates → report.

Each stage is keyed by a hash of its inputs (config section, model fingerprint, data
fingerprint, library versions) and writes into the run folder, so a re-run skips what is done
and an interrupted run resumes where it stopped. Models are loaded lazily: a run whose stages
are all finished only re-renders the report.
"""

from __future__ import annotations

import copy
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from . import determinism, judges
from .calibration import auto_batch_size, calibration_batches, calibration_samples, expand_alphas  # noqa: F401  (re-exported)
from .checksum import checksums
from .config import GateConfig
from .data import dataset_identity
from .diagnostics.stage import run_diagnostics
from .engines.base import BuildContext
from .engines.builders import BUILDERS
from .errors import ConfigError
from .gates import GATES, data_identities
from .gates.base import GateContext, GateSpec
from .io import atomic_write_json, read_json
from .memory import PhaseMemory, free_memory
from .models import LoadedModel
from .progress import SILENT, Progress
from .quantize import modelopt_adapter  # its functions looked up at call time (tests replace save_state)
from .report import schema, write_reports
from .session import Session
from .snapshot.engine import MirrorCandidate
from .stages import Stage
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


def calibrate(s: Session, alpha: float | None = None) -> Stage | None:
    """Run (or reuse) calibration; returns the stage whose folder holds `quant_state.pt`."""
    q = s.config.quant
    if not s.config.calibrates:
        return None
    c = s.config.calibration
    stage = s.run.stage("calibrate", {
        "quant": q.model_dump(mode="json"), "alpha": alpha, "calibration": c.model_dump(mode="json"),
        "data": dataset_identity(c.dataset, s.config.resolve(c.dataset)), "model": s.ref.identity(),
        "versions": s.versions(), "seed": s.config.seed,
    })
    if stage.is_done():
        s.run.record(stage, cached=True)
        s.progress.log("calibrate: done earlier with the same inputs, reused")
        return stage
    modelopt_adapter.check_supported(q, s.ref.model.device)
    batches, info = calibration_batches(s.config, s.ref.model)
    started = stage.begin()
    torch.manual_seed(s.config.seed)
    with PhaseMemory() as mem:
        # a sequential run calibrates the reference's own weights (a copy would double the memory) and reloads it
        model = s.ref.model.model if s.ref.sequential else copy.deepcopy(s.ref.model.model)
        before = checksums(model.state_dict()) if s.ref.sequential else s.ref.model.model.state_dict()
        what = "the FP8 KV cache (weights as they are)" if q.kv_only else q.format.value
        with s.progress.task(f"calibrate {what} ({info['samples_used']}×{c.seq_len} tokens)", len(batches)) as advance:
            facts = modelopt_adapter.quantize(model, q, batches, s.ref.model.device, alpha=alpha, on_batch=lambda i: advance(1))
        saved = modelopt_adapter.save_state(model, before, stage.path / "quant_state.pt")
        del model
        if s.ref.sequential:
            s.ref.release("its weights were calibrated in place")
    stage.finish(started, {"calibration": info, "quantizers_enabled": facts["quantizers_enabled"],
                           "calibration_seconds": facts["seconds"], "saved": saved, "mtq_config": facts["mtq_config"],
                           "memory": mem.describe()})
    s.run.record(stage, cached=False)
    return stage


def build(s: Session, calib: Stage | None) -> Any:
    """The candidate, built on first use from the calibration's state (`s.candidate.engine` afterwards)."""
    if s.candidate.engine is None:
        builder = BUILDERS.get(s.config.engine.backend)
        s.progress.log(f"build: {s.config.engine.backend} candidate")
        ctx = BuildContext(config=s.config, reference=s.ref.model, calib_state=calib.path / "quant_state.pt" if calib else None,
                           run_dir=s.run.path, log=s.progress.log, consume_reference=s.ref.sequential)
        s.candidate.engine = builder(ctx)
        if s.ref.sequential:  # the candidate holds the reference's weights now (or its own): the reference leaves
            s.ref.release("the candidate was built from its weights")
    return s.candidate.engine


@dataclass
class Pending:
    """A gate that needs the reference again to finish (a sequential run's last phase): what `GateSpec.complete`
    and the stage's record take once the candidate has left."""

    spec: GateSpec
    stage: Stage
    started: float  # when its stage began (Stage.begin)
    ctx: GateContext
    before: dict[str, Any] | None  # the snapshot's usage before the gate, where the reference keeps one


def run_gates(s: Session, calib: Stage | None, fail_fast: bool = False) -> dict[str, GateResult]:
    """Every enabled gate in order. With `fail_fast`, once a gate fails its own checks the later
    gates are not run: they are recorded as "skipped" and their checks fail, so the verdict is the
    same REJECT, reached without the cost of the rest (a sweep's 4-bit candidates on a small model)."""
    results: dict[str, GateResult] = {}
    shared = s.run.path.parent / ".reference"  # next to the run folders (--out or report.dir), shared by every candidate
    rejected_by: str | None = None
    pending: list[Pending] = []
    for spec in GATES.ordered():
        if not spec.enabled(s.config):
            continue
        if rejected_by is not None:
            results[spec.name] = GateResult(spec.name, "skipped", error=f"not run (--fail-fast): gate {rejected_by} already "
                                                                        "rejected the candidate")
            s.progress.log(f"gate {spec.name}: skipped, gate {rejected_by} already rejected the candidate (--fail-fast)")
            continue
        stage = s.run.stage(f"gate_{spec.name}", {
            "gate": spec.inputs(s.config), "model": s.ref.identity(), "candidate": s.candidate.identity(calib),
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
                reference = s.ref.for_gates(shared, in_memory=not s.ref.sequential)
                before = reference.usage() if getattr(reference, "keeps_snapshot", False) else None
                ctx = GateContext(config=s.config, reference=reference, candidate=candidate, tokenizer=s.ref.tokenizer,
                                  folder=stage.path, progress=s.progress, upstream=results)
                result = spec.run(ctx)
            if result.status == "pending":  # finished once the reference is back (a sequential run's last phase)
                pending.append(Pending(spec, stage, started, ctx, before))
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
            entry.ctx.candidate = None
        candidate = ctx = None  # noqa: F841
        s.candidate.leave()
        free_memory()
        reference = s.ref.for_gates(shared, in_memory=True)
        for entry in pending:
            s.progress.log(f"gate {entry.spec.name}: the reference finishes what needed the candidate's output")
            with PhaseMemory() as mem:
                entry.ctx.reference = reference
                result = entry.spec.complete(entry.ctx, results[entry.spec.name])
            _finish(s, entry.stage, entry.started, result, reference, entry.before, mem)
            results[entry.spec.name] = result
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


def fill_gates(s: Session, shared: Path) -> dict[str, Any]:
    """The snapshot filled with the reference alone (`qval reference`, a sequential run's first phase):
    every enabled gate's reference work into the snapshot, with the reference alone: each gate
    runs against `MirrorCandidate` (the reference answering for the candidate from its own
    outputs), so it asks the reference exactly what it asks with a real candidate; its figures are
    discarded. What depends on a real candidate's output (the judge of its text, the answers where
    the two disagree) cannot be stored in advance. Returns each gate's use of the snapshot."""
    reference = s.ref.for_gates(shared)
    mirror = MirrorCandidate(reference)
    gates: dict[str, Any] = {}
    done: dict[str, Any] = {}
    try:
        with tempfile.TemporaryDirectory(prefix="qval-reference-") as tmp:
            for spec in GATES.ordered():
                if not spec.enabled(s.config):
                    continue
                before = reference.usage()
                folder = Path(tmp) / f"gate_{spec.name}"  # as in a run folder
                folder.mkdir()
                torch.manual_seed(s.config.seed)
                with PhaseMemory() as mem:
                    ctx = GateContext(config=s.config, reference=reference, candidate=mirror, tokenizer=s.ref.tokenizer, folder=folder,
                                      progress=s.progress, upstream=done)
                    result = spec.run(ctx)
                result.folder = folder  # gate 2 reads gate 1's positions through `done` (GateContext.upstream)
                done[spec.name] = result
                after = reference.usage()
                gates[spec.name] = {"status": result.status, "error": result.error, "memory": mem.describe(),
                                    **{k: round(after[k] - before[k], 2) for k in before}}
                if result.status == "error":  # the reference itself failed (non-finite logits): say so, stop
                    break
    finally:
        reference.mirror(False)
    return gates


def fill_reference(cfg: GateConfig, progress: Progress = SILENT, out_dir: str | None = None) -> dict[str, Any]:
    """`qval reference`: `fill_gates` for one config, the reference alone in memory; the snapshot's
    description and each gate's use of it."""
    check_fillable(cfg)
    determinism.configure(Session.device_of(cfg))
    s = Session.open(cfg, out_dir, progress)
    gates = fill_gates(s, s.run.path.parent / ".reference")
    return {"snapshot": s.ref.snapshot_description(), "gates": gates}


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
    s = Session.open(cfg, out_dir, progress, loaded=reference, loader=loader)
    fill: dict[str, Any] | None = None  # a sequential run's first phase: each gate's reference work
    if s.ref.sequential:
        s.progress.log("sequential: the reference alone fills the snapshot first")
        with PhaseMemory() as mem:
            filled = fill_gates(s, s.run.path.parent / ".reference")
        fill = {"gates": filled, "memory": mem.describe()}
        s.ref.release("the snapshot holds what the gates ask of it")
    try:
        calib = calibrate(s, alpha)
        results = run_gates(s, calib, fail_fast)
        verdict = judges.verdict(cfg, results)
        mode = sensitivity or cfg.diagnostics.sensitivity
        diagnostics = run_diagnostics(s, calib, mode == "always" or (mode == "auto" and not verdict.approved))
        report = schema.build_report(cfg, verdict, results, reference=s.ref.report_description(fill),
                                     engine=s.candidate.described(),
                                     calibration=calib.meta() if calib else None, stages=s.run.log, environment=s.env,
                                     numerics=determinism.describe(), diagnostics=diagnostics, seconds=time.perf_counter() - t0,
                                     data=data_identities(cfg))
    finally:  # a server the candidate or the reference started stops on every exit path (an error, Ctrl-C)
        s.close()
    write_reports(s.run.path, report)
    return RunResult(config=cfg, verdict=verdict, run_dir=s.run.path, report=report)
