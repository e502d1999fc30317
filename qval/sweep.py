"""`qval sweep`: many candidate configs against one reference, ranked, with a recommendation.

The reference is loaded once and handed to every candidate's run; every run folder sits under
one output folder, so everything the gates need from the reference (the snapshot, qval/snapshot:
its compact logits and generations) is computed by the first candidate that needs it and read
from `<out>/.reference/` by all the others. With snapshot.sequential the sweep does not keep the
reference loaded: each candidate's run loads it when a phase needs it (one model in memory at a
time), and only the first candidate's fill phase computes reference passes.

The ranking puts the candidates that pass every gate first, smallest deployment first (weights
plus the KV cache of `context` tokens for `batch` sequences), and recommends the first of them:
the smallest configuration that passes every gate. A candidate that cannot be built here
(e.g. nvfp4 without a GPU) is listed with its error and never recommended.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .config import GateConfig, load_config
from .cost import kv_bytes_per_element, model_weight_bits
from .errors import ConfigError, QvalError
from .gate_registry import SWEEP_FIGURES
from .io import atomic_write_json, atomic_write_text, hash_json
from .ranking import rank_key, standing, worst_drop

if TYPE_CHECKING:
    import torch

    from .models import LoadedModel
    from .pipeline import RunResult
    from .progress import Progress


@dataclass
class Footprint:
    """Deployment memory of one candidate, estimated from the reference's shapes."""

    weight_bits: float  # average stored bits per parameter, scales included
    weight_bytes: float
    kv_bytes_per_token: float  # one sequence, all layers, K and V
    kv_bytes: float  # at the sweep's context × batch

    @property
    def total_bytes(self) -> float:
        return self.weight_bytes + self.kv_bytes

    def to_dict(self) -> dict[str, Any]:
        return {"weight_bits": round(self.weight_bits, 4), "weight_bytes": int(self.weight_bytes),
                "kv_bytes_per_token": int(self.kv_bytes_per_token), "kv_bytes": int(self.kv_bytes),
                "total_bytes": int(self.total_bytes)}


def footprint(cfg: GateConfig, model: "torch.nn.Module", context: int, batch: int) -> Footprint:
    """Quantized linears at the format's bits per weight, every other parameter at the deployment
    dtype (`model.dtype` of the config: 16 bits for float16/bfloat16); tied tensors count once
    (`qval.cost.model_weight_bits`: over all parameters, not the fallback's linear layers only).
    KV cache: 2 (K, V) × layers × KV heads × head dim per token, 1 byte each for fp8, else the
    deployment dtype.

    >>> import torch
    >>> m = torch.nn.Sequential(torch.nn.Linear(4, 2, bias=False))
    >>> m.config = type("C", (), {"num_hidden_layers": 1, "num_attention_heads": 1, "hidden_size": 4})()
    >>> cfg = GateConfig.model_validate({"name": "x", "quant": {"format": "fp8", "exclude": []},
    ...                                  "gates": {"agreement": {"enabled": False}}})
    >>> footprint(cfg, m, context=10, batch=1).to_dict()
    {'weight_bits': 8.0, 'weight_bytes': 8, 'kv_bytes_per_token': 16, 'kv_bytes': 160, 'total_bytes': 168}
    """
    w = model_weight_bits(model, cfg)
    c = model.config
    heads = getattr(c, "num_attention_heads", 1)
    kv_heads = getattr(c, "num_key_value_heads", None) or heads
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // heads
    per_token = 2 * c.num_hidden_layers * kv_heads * head_dim * kv_bytes_per_element(cfg.quant, cfg.model.dtype)
    return Footprint(w.per_param, w.bits / 8, per_token, per_token * context * batch)


@dataclass
class SweepEntry:
    config: GateConfig
    alpha: float | None
    footprint: Footprint | None = None
    run: "RunResult | None" = None
    error: str | None = None
    seconds: float = 0.0

    @property
    def status(self) -> str:
        if self.run is None:
            return "ERROR"
        return "APPROVE" if self.run.verdict.approved else "REJECT"

    def figures(self) -> dict[str, float | None]:
        out: dict[str, float | None] = {}
        gates = self.run.report["gates"] if self.run else {}
        for g, m, _ in SWEEP_FIGURES:  # the rows of the gates' tables with a sweep column
            e = gates.get(g, {}).get("measurements", {}).get(m)
            out[f"{g}.{m}"] = e.get("value") if e else None
        # gate 4: the worst suite's paired drop (reference − candidate), the answers' summary figure
        out["tasks.worst_drop"] = worst_drop(self.run.report) if self.run else None
        return out

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"name": self.config.name, "config_file": self.config.source_file, "format": self.config.quant.format.value,
                             "kv_cache": self.config.quant.kv_cache.value, "engine": self.config.engine.backend,
                             "status": self.status, "footprint": self.footprint.to_dict() if self.footprint else None,
                             "figures": self.figures(), "seconds": round(self.seconds, 2)}
        if self.run:
            d["failed_checks"] = [f"{c.gate}/{c.metric}: {c.reason}" for c in self.run.verdict.failures]
            d["report"] = str(self.run.run_dir / "report.md")
        if self.error:
            d["error"] = self.error
        return d


@dataclass
class SweepResult:
    entries: list[SweepEntry]
    folder: Path
    context: int
    batch: int
    reference: dict[str, Any] = field(default_factory=dict)

    def ranked(self) -> list[SweepEntry]:
        """Best first, by `ranking`'s "smallest" policy (approved, then size, then answers lost, then KLD)."""

        def key(e: SweepEntry) -> tuple[Any, ...]:
            return rank_key(standing(e.run, e.footprint.total_bytes if e.footprint else None), "smallest")

        return sorted(self.entries, key=key)

    @property
    def recommended(self) -> SweepEntry | None:
        best = self.ranked()[0] if self.entries else None
        return best if best is not None and best.status == "APPROVE" else None

    @property
    def exit_code(self) -> int:
        return 0 if self.recommended else 1

    def recommendation(self) -> str:
        r = self.recommended
        if r is None:
            return "no candidate passes every gate: none is recommended."
        fp = r.footprint
        return (f"{r.config.name}: the smallest configuration that passes every gate "
                f"({fp.weight_bits:.2f} bits/weight, weights {fp.weight_bytes / 2**20:.1f} MiB, "
                f"KV cache {fp.kv_bytes / 2**20:.1f} MiB at {self.context} tokens × {self.batch}).")

    def to_dict(self) -> dict[str, Any]:
        return {"schema": "qval.sweep", "schema_version": 1, "context": self.context, "batch": self.batch,
                "reference": self.reference, "ranking": [e.to_dict() for e in self.ranked()],
                "recommended": self.recommended.config.name if self.recommended else None,
                "recommendation": self.recommendation()}


def expand(paths: list[Path]) -> list[tuple[GateConfig, float | None]]:
    """Every config (an alpha list becomes one candidate per alpha); all problems at once."""
    from .pipeline import expand_alphas

    out, problems = [], []
    for p in paths:
        try:
            out.extend(expand_alphas(load_config(p)))
        except ConfigError as err:
            problems.append(str(err))
    if problems:
        raise ConfigError("\n".join(problems))
    if not out:
        raise ConfigError("qval sweep needs at least one config file (e.g. qval sweep checks/*.yaml).")
    names = [c.name for c, _ in out]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ConfigError(f"candidate names must be unique in a sweep (they name the run folders); repeated: {', '.join(dupes)}.")
    if served := [str(c.source_file) for c, _ in out if c.model.source == "served"]:
        raise ConfigError(f"{', '.join(sorted(set(served)))}: the reference is served (model.source: served); a sweep "
                          "holds one reference in memory for every candidate, and a served one has no weights here: gate "
                          "each config with qval gate.")
    models = {hash_json(c.model.model_dump(mode="json")): c for c, _ in out}
    if len(models) > 1:
        a, b = list(models.values())[:2]
        raise ConfigError(f"a sweep compares candidates of one reference, but {a.source_file} and {b.source_file} name "
                          f"different models ({a.model.model_dump(exclude_none=True)} vs {b.model.model_dump(exclude_none=True)}).")
    return out


def refuse_unfit(candidates: list[tuple[GateConfig, float | None]], progress: "Progress") -> dict[str, str]:
    """The preflight of every candidate, before the reference loads: name -> why it cannot run
    here (reported as that candidate's error; the others still run). When none can run, the
    sweep stops with every reason. The tokenizer is loaded once: a sweep has one reference."""
    from .preflight import preflight, reference_tokenizer

    tokenizer = reference_tokenizer(candidates[0][0])
    refused: dict[str, str] = {}
    seen: dict[str, str | None] = {}  # preflight inputs -> error, None when the candidate fits
    for cfg, _ in candidates:
        inputs = cfg.model_dump(mode="json", exclude={"name"})
        inputs["quant"].pop("smoothquant_alpha", None)  # the alphas of one config share one preflight
        key = hash_json(inputs)
        if key not in seen:
            try:
                for note in preflight(cfg, tokenizer=tokenizer):
                    progress.log(f"{cfg.name}: shortfall: {note}")
                seen[key] = None
            except QvalError as err:
                seen[key] = str(err)
        if seen[key] is not None:
            refused[cfg.name] = seen[key]
    if len(refused) == len(candidates):
        raise QvalError("no candidate of the sweep can run here:\n" + "\n".join(f"{n}: {e}" for n, e in refused.items()))
    return refused


def run_sweep(paths: list[Path], progress: "Progress", out_dir: str | None = None, context: int = 4096, batch: int = 1,
              reference: "LoadedModel | None" = None, fail_fast: bool = False, parallel: str | None = None) -> SweepResult:
    """Gate every candidate against one loaded reference; write sweep.json and sweep.md.
    `parallel` (auto, N, cpu:N): candidates in worker processes, one per GPU or group (qval/parallel.py)."""
    import os

    import torch

    from .memory import free_memory
    from .models import load_model
    from .parallel import slots
    from .pipeline import run_gate

    candidates = expand(paths)
    folder = Path(out_dir or candidates[0][0].report.dir)
    refused = refuse_unfit(candidates, progress)
    workers = slots(parallel, torch.cuda.device_count() if torch.cuda.is_available() else 0, os.cpu_count() or 1)
    if workers:
        result = run_parallel(candidates, refused, folder, workers, progress, context, batch, fail_fast)
        atomic_write_json(folder / "sweep.json", result.to_dict())
        atomic_write_text(folder / "sweep.md", render(result))
        return result
    if reference is None:
        progress.log(f"loading the reference once for {len(candidates)} candidates …")
        reference = load_model(candidates[0][0].model)
    result = SweepResult(entries=[], folder=folder, context=context, batch=batch, reference=reference.describe())
    footprints = [footprint(cfg, reference.model, context, batch) for cfg, _ in candidates]
    if any(cfg.snapshot.sequential for cfg, _ in candidates):  # one model at a time: the runs load it themselves
        progress.log("sequential: the reference is not kept loaded between candidates")
        reference = None  # type: ignore[assignment]
        free_memory()
    for i, (cfg, alpha) in enumerate(candidates, 1):
        progress.log(f"sweep {i}/{len(candidates)}: {cfg.name}")
        entry = SweepEntry(cfg, alpha, footprint=footprints[i - 1])
        t0 = time.perf_counter()
        try:
            if cfg.name in refused:
                entry.error = refused[cfg.name]
            else:
                entry.run = run_gate(cfg, progress, str(folder), alpha, reference=reference, fail_fast=fail_fast)
        except QvalError as err:  # this candidate cannot run here; the others still can
            entry.error = str(err)
        entry.seconds = time.perf_counter() - t0
        result.entries.append(entry)
    atomic_write_json(folder / "sweep.json", result.to_dict())
    atomic_write_text(folder / "sweep.md", render(result))
    return result


def run_parallel(candidates: list[tuple[GateConfig, float | None]], refused: dict[str, str], folder: Path, workers: list[Any],
                 progress: "Progress", context: int, batch: int, fail_fast: bool) -> SweepResult:
    """The sweep in worker processes (qval/parallel.py): the snapshot filled once by `qval reference`,
    then one `qval gate` per config file in the first free worker; the reports read back."""
    from .models import meta_model
    from .parallel import last_line, qval_process, schedule
    from .pipeline import RunResult
    from .verdict import Check, Verdict

    first = candidates[0][0]
    shapes = meta_model(first.model)  # the footprints' shapes, no weights: the GPUs are the workers'
    logs = folder / "workers"
    t0 = time.time()
    if first.snapshot.enabled:
        progress.log(f"parallel sweep: the reference snapshot filled once, by {first.name}'s config")
        ((_, code, _),) = schedule([first.source_file], workers[:1], lambda f, w: qval_process(
            ["reference", "--config", str(f), "--out", str(folder), "-q"], w, logs / "reference.log"))
        if code != 0:
            raise QvalError(f"qval reference failed (exit {code}): {last_line(logs / 'reference.log')}; every candidate "
                            f"needs it: fix that first (its log: {logs / 'reference.log'}).")
    files = list(dict.fromkeys(c.source_file for c, _ in candidates if c.name not in refused))
    progress.log(f"parallel sweep: {len(files)} config files on {len(workers)} workers "
                 f"({', '.join(w.gpus or 'cpu' for w in workers)})")
    ran = {f: (code, w) for f, code, w in schedule(files, workers, lambda f, w: qval_process(
        ["gate", "--config", str(f), "--out", str(folder), "-q", *(["--fail-fast"] if fail_fast else [])], w,
        logs / f"{Path(str(f)).stem}.log"))}
    from .model_location import locate

    _, _, name, fingerprint = locate(first.model)
    result = SweepResult(entries=[], folder=folder, context=context, batch=batch,
                         reference={"name": name, "fingerprint": fingerprint, "loaded_by": "each worker",
                                    "parallel_workers": [w.gpus or "cpu" for w in workers]})
    for cfg, alpha in candidates:
        entry = SweepEntry(cfg, alpha, footprint=footprint(cfg, shapes, context, batch))
        path = folder / cfg.name / "report.json"
        if cfg.name in refused:
            entry.error = refused[cfg.name]
        elif path.is_file() and path.stat().st_mtime >= t0:  # written by this sweep's worker, not left by an older run
            report = json.loads(path.read_text(encoding="utf-8"))
            checks = [Check.from_dict(c) for c in report["verdict"]["checks"]]
            entry.run = RunResult(cfg, Verdict(report["verdict"]["approved"], checks), path.parent, report)
            entry.seconds = float(report.get("seconds") or 0.0)
        else:
            code, w = ran[cfg.source_file]
            log = logs / f"{Path(str(cfg.source_file)).stem}.log"
            entry.error = f"its worker ({w.gpus or 'cpu'}) exited {code} without a report: {last_line(log)} (log: {log})"
        result.entries.append(entry)
    return result


def _mib(x: float) -> str:
    return f"{x / 2**20:.1f}"


def _num(x: float | None) -> str:
    return "–" if x is None else f"{x:.4g}"


def render(result: SweepResult) -> str:
    lines = [f"# qval sweep: {len(result.entries)} candidates", "",
             f"Reference: {result.reference.get('name')} (fingerprint `{str(result.reference.get('fingerprint'))[:12]}`), "
             f"loaded once. KV cache sized for {result.context} tokens × {result.batch} sequence(s).", "",
             f"**Recommendation**: {result.recommendation()}", "",
             "| rank | candidate | verdict | format | KV | bits/weight | weights MiB | KV MiB | "
             + "".join(f"{head} | " for _, _, head in SWEEP_FIGURES) + "worst task drop | why not |",
             "|---" * (10 + len(SWEEP_FIGURES)) + "|"]
    for rank, e in enumerate(result.ranked(), 1):
        f, fp = e.figures(), e.footprint
        why = e.error or ("; ".join(f"{c.gate}/{c.metric}" for c in e.run.verdict.failures) if e.run else "")
        lines.append(f"| {rank} | {e.config.name} | {e.status} | {e.config.quant.format.value} | {e.config.quant.kv_cache.value} | "
                     f"{fp.weight_bits:.2f} | {_mib(fp.weight_bytes)} | {_mib(fp.kv_bytes)} | "
                     + "".join(f"{_num(f[f'{g}.{m}'])} | " for g, m, _ in SWEEP_FIGURES)
                     + f"{_num(f['tasks.worst_drop'])} | {why.replace('|', '/')[:160]} |")
    lines += ["", "Memory is estimated from the reference's shapes: quantized linears at the format's bits per weight "
              "(scales included), other parameters at the deployment dtype, tied tensors once.", ""]
    for e in result.ranked():
        if e.run:
            lines.append(f"- {e.config.name}: {e.run.run_dir / 'report.md'}")
    return "\n".join(lines) + "\n"
