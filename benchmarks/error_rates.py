"""The verdict's own error rates (issue 29): how often qval rejects a healthy candidate, and how much
planted damage each check catches.

    python benchmarks/error_rates.py --out DIR checks/fp8_kvfp16.yaml --healthy 20 \\
        --faults layer_scale weight_noise --fault-seeds 5 --workers 6 --device cuda --dtype float32 --deadline 480
    python benchmarks/error_rates.py --out DIR checks/fp8_kvfp16.yaml --healthy 2 --faults layer_scale:3 \\
        --fault-seeds 1 --tiny          # a CPU smoke run: every budget shrunk, a few minutes on two cores

Healthy variants are the check as shipped with its calibration drawn from other windows of the same
calibration data (`calibration.sample_seed` 1..N; the shipped selection runs first as `shipped`).
Faults (qval/faults.py) are planted into the check's own candidate after it is built, through a
`planted` engine backend registered here (it builds `fakequant`'s candidate, then `faults.plant`s
the fault named in `engine.options`, so the fault is in the report and in every stage key); each
fault seed also calibrates on its own sample (`sample_seed` = seed). Everything runs through
`qval.pipeline.run_gate`, diagnostics off (they never change a verdict). The reference is loaded
once per worker process; the shipped variant runs first, alone, and fills the reference snapshot
that every later run reads back. After each run DIR/error_rates.json and DIR/error_rates.md are
rewritten (benchmarks/error_rates_tables.py), so a run cut off by --deadline (no run starts after
it; runs in flight finish unless --hard-deadline passes) still leaves its tables.

The GPU-against-CPU variant is the same variants run with `--device cpu` and `--device cuda` (float32
both) into two folders; their error_rates.json hold every check's figure per variant to compare.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import platform
import queue
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from pydantic import BaseModel, ConfigDict, Field  # noqa: E402

from qval.faults import GRID, Fault, plant  # noqa: E402
from qval.gate_metrics import Spread  # noqa: E402
from qval.verdict import CheckKey, row_of  # noqa: E402


class PlantedOptions(BaseModel):
    """`engine.options` of the `planted` backend: one fault of qval/faults.py."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: str
    severity: float = Field(ge=0)
    seed: int = 0
    start: int = 512


def register_planted() -> None:
    """The `planted` backend: fakequant's candidate with a fault planted after it is built."""
    from qval.engines.builders import BUILDERS
    from qval.backends import BACKENDS, Backend

    if "planted" in BACKENDS:
        return

    def build_planted(ctx):  # noqa: ANN001, ANN202 - a BuildContext -> an Engine
        engine = BUILDERS.get("fakequant")(ctx)
        fault = Fault(**PlantedOptions.model_validate(ctx.config.engine.options).model_dump())
        planted = plant(engine.model, fault)
        engine.notes.append(f"planted fault {fault.label}, seed {fault.seed} (qval/faults.py): {planted.what}")
        return engine

    BACKENDS.register("planted")(Backend("planted", options_model=PlantedOptions))
    BUILDERS.register("planted")(build_planted)


def tiny(cfg):  # noqa: ANN001, ANN201 - a GateConfig at budgets two CPU cores run in about a minute
    g = cfg.gates
    upd = lambda m, **kw: m.model_copy(update={k: v for k, v in kw.items() if k in type(m).model_fields})  # noqa: E731
    gates = {
        "agreement": upd(g.agreement, tokens=1024, ctx=256),
        "quality": upd(g.quality, bleu_max_new_tokens=12, bootstrap=100, max_prompts=8),
        "longgen": upd(g.longgen, max_prompts=3, new_tokens=64, window=32, edge=32, piece=64),
        "depth": upd(g.depth, ctx=256, tokens=512, piece=128, window=64, buckets=None),
        "retrieval": upd(g.retrieval, lengths=[256], depths=[0.0, 1.0], trials=1),
        "tasks": upd(g.tasks, suites=[upd(s, size=6) if s.builtin else upd(s, limit=4) for s in g.tasks.suites]),
    }
    return cfg.model_copy(update={"calibration": upd(cfg.calibration, samples=4, seq_len=128),
                                  "gates": g.model_copy(update=gates)})


def jobs(checks: list[str], healthy: int, faults: list[tuple[str, list[float]]], fault_seeds: int,
         healthy_from: int = 1, fault_seeds_from: int = 1) -> list[dict[str, Any]]:
    """The shipped variant of each check first, then its healthy variants (sample seeds healthy_from ..
    healthy_from + healthy - 1), then the faults seed by seed (seeds fault_seeds_from .. fault_seeds_from
    + fault_seeds - 1, so a run cut short has every severity at its first seeds)."""
    out = []
    for check in checks:
        out.append({"check": check, "variant": "shipped", "sample_seed": None})
        out += [{"check": check, "variant": "healthy", "sample_seed": s} for s in range(healthy_from, healthy_from + healthy)]
        out += [{"check": check, "variant": "fault", "sample_seed": seed, "fault": {"kind": kind, "severity": sev, "seed": seed}}
                for seed in range(fault_seeds_from, fault_seeds_from + fault_seeds) for kind, sevs in faults for sev in sevs]
    return out


def job_name(job: dict[str, Any]) -> str:
    stem = Path(job["check"]).stem
    if job["variant"] == "shipped":
        return f"{stem}-shipped"
    if job["variant"] == "healthy":
        return f"{stem}-s{job['sample_seed']}"
    f = job["fault"]
    return f"{stem}-{f['kind']}-{f['severity']:g}-s{f['seed']}"


def config_for(job: dict[str, Any], args: argparse.Namespace):  # noqa: ANN201 - a GateConfig
    from qval.config import load_config

    cfg = load_config(job["check"])
    if args.tiny:
        cfg = tiny(cfg)
    update: dict[str, Any] = {
        "name": job_name(job),
        "model": cfg.model.model_copy(update={"device": args.device, "dtype": args.dtype}),
        "calibration": cfg.calibration.model_copy(update={"sample_seed": job["sample_seed"]}),
        "diagnostics": cfg.diagnostics.model_copy(update={"enabled": False, "sensitivity": "never"}),
    }
    if job["variant"] == "fault":
        update["engine"] = cfg.engine.model_copy(update={"backend": "planted", "options": {**job["fault"], "start": args.fault_start}})
    return cfg.model_copy(update=update)


def is_median(gate: str, metric: str) -> bool:
    """Whether a check's figure is a median over prompts (gate 3's judge-NLL excess), by its gate_metrics row."""
    row = row_of(CheckKey.parse(gate, metric))  # a stored check's name read back to its key
    return row is not None and isinstance(row.sizing, Spread) and row.sizing.median


def summary(job: dict[str, Any], report: dict[str, Any], seconds: float) -> dict[str, Any]:
    v = report["verdict"]
    # "healthy": the centre a sized limit was set around (absent: 0); "statistic": "median" where the figure is a
    # median over prompts (its gate_metrics row says so), else absent: the mean
    checks = {f"{c['gate']}/{c['metric']}": {**{k: c.get(k) for k in ("value", "lo", "hi", "op", "limit", "on", "source", "outcome")},
                                             **({"healthy": c["healthy"]} if c.get("healthy") is not None else {}),
                                             **({"statistic": "median"} if is_median(c["gate"], c["metric"]) else {})}
              for c in v["checks"]}
    failed = [{"check": f"{c['gate']}/{c['metric']}", "reason": c["reason"]} for c in v["checks"] if c["outcome"] == "fail"]
    return {**job, "name": job_name(job), "decision": v["decision"], "seconds": round(seconds, 1), "failed": failed,
            "checks": checks, "calibration_windows": ((report.get("calibration") or {}).get("calibration") or {}).get("windows"),
            "longgen": longgen_measured(report)}


PER_PROMPT = ("id", "ref_late_nll", "cand_late_judge_nll", "ref_loop_period", "cand_loop_period", "early_top1", "late_top1")


def longgen_measured(report: dict[str, Any]) -> dict[str, Any] | None:
    """Gate 3's top-1 and KLD at both edges with their intervals, the loop rule's natural prompts (the early
    edge is natural text even where the late one loops: what `min_late_top1` is derived from), and per prompt
    the late NLLs and loop periods (what a judge-NLL statistic other than the mean is judged from)."""
    g = (report.get("gates") or {}).get("longgen") or {}
    m, d = g.get("measurements") or {}, g.get("details") or {}
    if not m:
        return None
    keys = ("early_top1", "late_top1", "top1_drift", "early_kld", "late_kld", "late_drift")
    return {**{k: {f: m[k].get(f) for f in ("value", "stderr", "lo", "hi", "n")} for k in keys if k in m},
            "natural_prompts": (d.get("loop_rule") or {}).get("natural_prompts"), "edge": d.get("edge"),
            "per_prompt": [{k: p.get(k) for k in PER_PROMPT} for p in d.get("per_prompt") or []]}


def worker(wid: int, args: argparse.Namespace, todo: Any, done: Any) -> None:
    """One process: the reference loaded once, then jobs until the queue says stop or the deadline passed."""
    import contextlib

    from qval.cli import quiet_libraries
    from qval.models import load_model
    from qval.pipeline import run_gate
    from qval.progress import SILENT, Progress

    class Stamped(Progress):
        """qval's own progress lines, each stamped with the worker and the seconds since its run began."""

        def __init__(self) -> None:  # plain lines, no rich bars (a log file, not a terminal)
            super().__init__(enabled=False)
            self.enabled, self.t0 = True, time.time()

        def log(self, message: str) -> None:
            print(f"[w{wid} +{time.time() - self.t0:6.1f} s] {message}", file=sys.stderr, flush=True)

    progress = Stamped() if args.progress else SILENT
    if args.trace_every:  # every thread's Python stack to stderr every N seconds: where a slow run spends its time
        import faulthandler

        faulthandler.dump_traceback_later(args.trace_every, repeat=True, file=sys.stderr)

    if args.device == "cuda":  # ModelOpt's eager FP8 path instead of its CUDA-kernel JIT build (as benchmarks' nojit does)
        import os

        import torch
        from modelopt.torch.quantization import extensions

        torch.set_num_threads(max(1, (os.cpu_count() or 1) // args.workers))  # the workers share the cores

        if not args.modelopt_cuda_ext:  # INT8 then runs ModelOpt's pure-torch fallback (a host sync in its source: no CUDA graph)
            for getter in (extensions.get_cuda_ext, extensions.get_cuda_ext_fp8, extensions.get_cuda_ext_mx):
                getter.extension = None
    register_planted()
    reference = None
    with contextlib.ExitStack() as stack:
        stack.enter_context(quiet_libraries())
        while True:
            job = todo.get()
            if job is None or time.time() > args.stop_at:
                break
            t0 = time.time()
            try:
                cfg = config_for(job, args)
                if reference is None:
                    reference = load_model(cfg.model)
                if isinstance(progress, Stamped):
                    progress.log(f"{job_name(job)}: starts")
                    progress.t0 = time.time()
                r = run_gate(cfg, progress=progress, out_dir=str(Path(args.out) / "runs"), reference=reference, sensitivity="never")
                done.put(summary(job, r.report, time.time() - t0) | {"worker": wid})
            except Exception as err:  # a run that breaks is a row of the table, not the end of the measurement
                done.put({**job, "name": job_name(job), "decision": "ERROR", "seconds": round(time.time() - t0, 1), "worker": wid,
                          "error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()[-2000:]})
    done.put({"worker_exit": wid})


def parse_faults(specs: list[str]) -> list[tuple[str, list[float]]]:
    """'layer_scale' (its default grid) or 'layer_scale:0.1,1,3'."""
    out = []
    for s in specs:
        kind, _, sevs = s.partition(":")
        if kind not in GRID:
            raise SystemExit(f"--faults {s}: unknown kind; the kinds: {', '.join(GRID)}")
        out.append((kind, [float(x) for x in sevs.split(",")] if sevs else list(GRID[kind])))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checks", nargs="+")
    ap.add_argument("--out", required=True)
    ap.add_argument("--healthy", type=int, default=20, help="healthy variants per check (calibration.sample_seed 1..N)")
    ap.add_argument("--healthy-from", type=int, default=1, help="the first healthy variant's sample seed (to extend an earlier run)")
    ap.add_argument("--no-shipped", action="store_true",
                    help="skip the shipped variant: an earlier call into the same --out filled the reference snapshot "
                         "(every worker starts at once)")
    ap.add_argument("--faults", nargs="*", default=[], help="fault kinds, each KIND or KIND:s1,s2,…")
    ap.add_argument("--fault-seeds", type=int, default=5, help="seeds per fault severity")
    ap.add_argument("--fault-seeds-from", type=int, default=1, help="the first fault seed (to extend an earlier run)")
    ap.add_argument("--fault-start", type=int, default=512, help="late_positions: the first damaged position")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda", "auto"])
    ap.add_argument("--dtype", default="float32", choices=["float16", "bfloat16", "float32"])
    ap.add_argument("--tiny", action="store_true", help="every budget shrunk (a CPU smoke run; not the shipped checks' figures)")
    ap.add_argument("--deadline", type=float, default=float("inf"), help="seconds after which no run starts")
    ap.add_argument("--modelopt-cuda-ext", action="store_true",
                    help="on a GPU, leave ModelOpt's CUDA extensions on (built by its JIT on first use) instead of its eager path")
    ap.add_argument("--progress", action="store_true", help="qval's stage lines on stderr, stamped with worker and seconds into the run")
    ap.add_argument("--trace-every", type=float, default=0, help="every N s, each worker's Python stacks on stderr (faulthandler)")
    ap.add_argument("--hard-deadline", type=float, default=float("inf"), help="seconds after which running workers are stopped")
    args = ap.parse_args()
    from error_rates_tables import render  # noqa: PLC0415 - beside this script

    t_start = time.time()
    args.stop_at = t_start + args.deadline
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    all_jobs = jobs(args.checks, args.healthy, parse_faults(args.faults), args.fault_seeds, args.healthy_from,
                    args.fault_seeds_from)
    meta = {"command": " ".join(sys.argv), "machine": platform.node(), "platform": platform.platform(), "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "device": args.device, "dtype": args.dtype, "tiny": args.tiny, "workers": args.workers, "jobs_planned": len(all_jobs)}
    results: list[dict[str, Any]] = []

    def write() -> None:
        meta["seconds"] = round(time.time() - t_start, 1)
        (out / "error_rates.json").write_text(json.dumps({"meta": meta, "results": results}, indent=1), encoding="utf-8")
        (out / "error_rates.md").write_text(render(meta, results), encoding="utf-8")

    ctx = mp.get_context("spawn")
    todo, done = ctx.Queue(), ctx.Queue()
    if args.no_shipped:
        all_jobs = [j for j in all_jobs if j["variant"] != "shipped"]
        meta["jobs_planned"] = len(all_jobs)
    first = [j for j in all_jobs if j["variant"] == "shipped"]
    rest = [j for j in all_jobs if j["variant"] != "shipped"]
    procs = [ctx.Process(target=worker, args=(0, args, todo, done), daemon=True)]

    def stop(signum: int, _frame: Any) -> None:  # SIGTERM (kill, timeout) ends it as Ctrl-C does: through finally
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    stopped = "deadline"
    try:
        procs[0].start()
        for j in first:  # alone: fills the reference snapshot the others read back
            todo.put(j)
        live, started = 1, False
        while live:
            if not started and sum(1 for r in results if r.get("variant") == "shipped") == len(first):
                started = True
                for j in rest:
                    todo.put(j)
                for w in range(1, args.workers):
                    procs.append(ctx.Process(target=worker, args=(w, args, todo, done), daemon=True))
                    procs[-1].start()
                live += args.workers - 1
                for _ in range(args.workers):
                    todo.put(None)
            try:
                msg = done.get(timeout=5)
            except queue.Empty:
                if time.time() - t_start > args.hard_deadline or not any(p.is_alive() for p in procs):
                    break
                continue
            if "worker_exit" in msg:
                live -= 1
                continue
            results.append(msg)
            print(f"[{time.time() - t_start:6.0f} s] {msg['name']}: {msg['decision']} ({msg['seconds']} s)"
                  + "".join(f"\n    {f['check']}: {f['reason']}" for f in msg.get("failed", []))
                  + (f"\n    {msg['error']}" if msg.get("error") else ""), flush=True)
            write()
    except (KeyboardInterrupt, SystemExit):
        stopped = "interrupted"
        raise
    finally:  # no worker outlives this process, and the tables hold every run that ended
        for p in procs:
            if p.is_alive():
                p.terminate()
        for p in procs:
            p.join(timeout=10)
        meta["stopped"] = "complete" if len(results) == len(all_jobs) else stopped
        write()
    print(render(meta, results))


if __name__ == "__main__":
    main()
