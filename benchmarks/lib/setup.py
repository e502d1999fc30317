"""What every GPU measurement of the suite sets up the same way: the environment it records, the
data sized to the budgets, a gate config that times the gates (thresholds too loose to reject), the
reference and its FP8 candidate built through qval's public pipeline, and a run whose steps are
each guarded, saved as they finish, and skipped when the deadline is near.

    run = Run(out / "decode.json", deadline=540)
    run.step("reference", needs=120, fn=lambda: ...)     # a failure is recorded, not raised
"""

from __future__ import annotations

import argparse
import gc
import inspect
import json
import platform
import time
import traceback
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

import torch

from . import shapes

ROOT = Path(__file__).resolve().parent.parent.parent

# the shipped default budgets (FULL) and a toy run of the same code anywhere (SMOKE)
FULL = dict(budgets=(16384, 65536), calib=(512, 512), batches=(1, 8, 32), plain_batches=(1, 8), plain_tokens=32,
            static_tokens=256, cand_batches=(1, 8), reps=3, identity_tokens=64, gate=dict())
SMOKE = dict(budgets=(512, 1024), calib=(8, 64), batches=(1, 2), plain_batches=(1,), plain_tokens=8, static_tokens=12,
             cand_batches=(1,), reps=1, identity_tokens=12,
             gate=dict(agreement=dict(tokens=1024, ctx=128), quality=dict(bleu_max_new_tokens=8, bootstrap=100),
                       longgen=dict(new_tokens=64, window=16, edge=16, piece=32, max_prompts=2)))


def environment() -> dict[str, Any]:
    import importlib.metadata as md

    env: dict[str, Any] = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "python": platform.python_version(),
                           "host_cpu": platform.processor() or platform.machine(), "threads": torch.get_num_threads()}
    for pkg in ("torch", "transformers", "nvidia-modelopt", "qval"):
        try:
            env[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            env[pkg] = None
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        env.update(gpu=p.name, gpu_memory_gib=round(p.total_memory / 2**30, 1), sm=f"{p.major}.{p.minor}",
                   multiprocessors=p.multi_processor_count, cuda=torch.version.cuda)
    return env


def device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def free(dev: str) -> None:
    gc.collect()
    if dev.startswith("cuda"):
        torch.cuda.empty_cache()


def expanded_jsonl(src: Path, dst: Path, tokenizer: Any, tokens: int) -> Path:
    """`src`'s records repeated until they hold `tokens` tokens: the shipped sets are smaller
    than the default budgets (512×512 calibration tokens, 65536 gate-1 tokens), and a speed
    benchmark must run the budget, not the shortfall."""
    from qval.data import load_dataset

    ds = load_dataset(str(src), src)
    texts = ds.texts()
    per_pass = sum(len(tokenizer(t)["input_ids"]) + 1 for t in texts)
    copies = max(1, -(-int(tokens * 1.05) // per_pass))
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_text("".join(json.dumps({"text": t}) + "\n" for _ in range(copies) for t in texts), encoding="utf-8")
    return dst


def bench_data(plan: dict[str, Any], tokenizer: Any, work: Path, heldout_tokens: int = 65536) -> dict[str, Path]:
    samples, seq_len = plan["calib"]
    return {"calib": expanded_jsonl(ROOT / "calib_data/general_mix.jsonl", work / "data/calib.jsonl", tokenizer, samples * seq_len),
            "heldout": expanded_jsonl(ROOT / "calib_data/heldout_eval.jsonl", work / "data/heldout.jsonl", tokenizer, heldout_tokens)}


def gate_config(name: str, model: dict[str, Any], data: dict[str, Path], report_dir: Path, plan: dict[str, Any],
                tokens: int | None = None, diagnostics: str = "on") -> Any:
    """A gate config with qval's default budgets (shrunk only by --smoke) and thresholds so
    loose that the verdict never triggers the rejected-candidate extras: we time the gates."""
    from qval.config import parse_config

    samples, seq_len = plan["calib"]
    g = plan["gate"]
    agreement = {"dataset": str(data["heldout"]), "min_top1": 0.0, "max_mean_kld": 1e9, "max_p99_kld": 1e9, **g.get("agreement", {})}
    if tokens is not None:
        agreement["tokens"] = tokens
    cfg = {
        "name": name, "model": model, "quant": {"format": "fp8", "kv_cache": "fp16"},
        "calibration": {"dataset": str(data["calib"]), "samples": samples, "seq_len": seq_len},
        "gates": {"agreement": agreement,
                  "quality": {"enabled": True, "max_ppl_ratio": 1e9, "max_bleu_drop": 100.0, **g.get("quality", {})},
                  "longgen": {"enabled": True, "max_loops_excess": 1000, "max_late_drift": 1e9, **g.get("longgen", {})}},
        "report": {"dir": str(report_dir)},
        "diagnostics": {"enabled": diagnostics == "on"},
    }
    return parse_config(cfg, f"<bench {name}>")


def stage_seconds(run_dir: Path) -> dict[str, Any]:
    """Seconds of every finished stage of a run folder (from each stage's done.json)."""
    out = {}
    for done in sorted(run_dir.glob("*/done.json")):
        try:
            out[done.parent.name] = {"seconds": json.loads(done.read_text(encoding="utf-8")).get("seconds"), "cached": False}
        except (OSError, ValueError):
            continue
    return out


@dataclass
class Built:
    """The reference's engine and the calibrated candidate's, built by qval's own pipeline."""

    reference: Any
    candidate: Any
    facts: dict[str, Any] = field(default_factory=dict)


def calibrate_and_build(loaded: Any, cfg: Any) -> Built:
    """Calibrate (or reuse the run folder's calibration) and build the candidate as `qval gate` does,
    with the already loaded reference (`Session.loader`): its engine and the candidate's."""
    from qval import pipeline
    from qval.progress import Progress

    s = pipeline.Session.open(cfg, progress=Progress(enabled=True), loader=lambda: loaded)
    calib = pipeline.calibrate(s)
    candidate = pipeline.build(s, calib)
    return Built(s.ref.engine, candidate, {"calibration": calib.meta() if calib else None, "stages": s.run.log})


def fresh_engine(engine: Any) -> Any:
    """A new engine of the same kind over the same model: no decoder kept from earlier steps, so a
    setting changed since (a module-level kernel switch) is captured anew. Notes and KV-cache
    quantizers carry over; the old engine's decoder is freed with the old engine."""
    kwargs: dict[str, Any] = {}
    if "runtime" in inspect.signature(type(engine).__init__).parameters:  # the engine's choice of runtime, kept
        kwargs["runtime"] = "qval" if getattr(engine, "runtime", None) is not None else "transformers"
    new = type(engine)(engine.model, engine.tokenizer, notes=list(engine.notes), decode=engine.decode, **kwargs)
    for attr in ("static_filled", "static_fused", "kv_quantizers"):
        if hasattr(engine, attr):
            setattr(new, attr, getattr(engine, attr))
    return new


def end_to_end(loaded: Any, cfg: Any) -> dict[str, Any]:
    """`run_gate` (what `qval gate` runs) with the already loaded reference: wall time, stages, gates."""
    from qval import pipeline
    from qval.progress import Progress

    t0 = time.perf_counter()
    result = pipeline.run_gate(cfg, progress=Progress(enabled=True), reference=loaded)
    wall = time.perf_counter() - t0
    rep = result.report
    return {"wall_s": wall, "approved": result.verdict.approved, "report_seconds": rep.get("seconds"),
            "stages": rep.get("stages"), "calibration": rep.get("calibration"),
            "gates": {k: {"seconds": v.get("seconds"), "status": v.get("status")} for k, v in rep.get("gates", {}).items()},
            "gate_details": {k: {kk: v.get("details", {}).get(kk) for kk in ("scored_positions", "chunks", "reference_generation",
                                                                                 "candidate_generation_seconds", "prompts")}
                             for k, v in rep.get("gates", {}).items()},
            "engines": {"reference": rep.get("model"), "candidate": rep["candidate"]["engine"]}}


def prebuild_fp8_kernel() -> dict[str, Any]:
    """ModelOpt JIT-compiles its FP8 fake-quant kernel on first use (once per machine, then
    cached under ~/.cache/torch_extensions); time it apart so it does not land in a stage."""
    import contextlib
    import io

    from modelopt.torch.quantization.extensions import get_cuda_ext_fp8

    t0 = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        ext = get_cuda_ext_fp8(raise_if_failed=False)
    return {"seconds": time.perf_counter() - t0, "built": ext is not None}


def load_tokenizer(tokenizer: str | None = None, gguf: str | None = None) -> Any:
    """A tokenizer folder, the GGUF's, or the built-in model's; a pad token set."""
    from transformers import AutoTokenizer

    if tokenizer:
        tok = AutoTokenizer.from_pretrained(tokenizer)
    elif gguf:
        tok = AutoTokenizer.from_pretrained(str(Path(gguf).parent), gguf_file=Path(gguf).name)
    else:
        from qval.config import ModelConfig
        from qval.models import load_tokenizer as qval_tokenizer

        tok = qval_tokenizer(ModelConfig())
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def load_shape(shape: str, tok: Any, dev: str, work: Path, gguf: str | None = None) -> tuple[Any, dict[str, Any]]:
    """The model a measurement runs and the `model:` section that names it: a random-weight layout
    (`shapes.SHAPES`) or `real`, the built-in model (its GGUF where qval finds it, or `gguf`)."""
    from qval.config import ModelConfig
    from qval.models import load_model

    if shape == "real":
        spec: dict[str, Any] = ({"source": "gguf", "gguf": str(Path(gguf).resolve())} if gguf else {"source": "default"})
        spec["dtype"] = "float16"
        return load_model(ModelConfig(**spec)), spec
    dtype = torch.bfloat16 if dev.startswith("cuda") else torch.float32
    loaded = shapes.random_llama(shape, tok, dev, dtype, work / f"model_{shape}")
    return loaded, {"source": "path", "path": str(work / f"model_{shape}"), "dtype": "bfloat16"}


def longgen_prompts(tok: Any) -> list[list[int]]:
    """Gate 3's prompts, rendered as the gate renders them (chat template)."""
    from qval.reference import render_prompts

    lines = (ROOT / "calib_data/longgen_prompts.jsonl").read_text(encoding="utf-8").splitlines()
    prompts, _ = render_prompts(tok, [json.loads(line)["prompt"] for line in lines if line.strip()])
    return prompts


def common_args(ap: argparse.ArgumentParser, steps: str, out: str) -> None:
    """The arguments every GPU measurement takes."""
    ap.add_argument("--out", default=out, help=f"folder for the results (default {out})")
    ap.add_argument("--only", default=steps, help=f"comma list of steps (default: {steps})")
    ap.add_argument("--shape", default="8b", help=f"model: {', '.join(s for s in shapes.SHAPES if s != 'smoke')} (random weights) or real")
    ap.add_argument("--tokenizer", help="tokenizer folder for the random layouts (default: the built-in model's)")
    ap.add_argument("--gguf", help="the built-in model's GGUF file for --shape real, when qval cannot find it")
    ap.add_argument("--deadline", type=float, default=1e9, help="seconds this run may take; a step that would start later is skipped")
    ap.add_argument("--deterministic", action="store_true",
                    help="qval's deterministic mode from the start, as run_gate sets it on a GPU (the gate's own numerics)")
    ap.add_argument("--smoke", action="store_true", help="toy shape and budgets on any device: check the script in a few minutes")


class Run:
    """One measurement run: its results saved to `path` after every step; each step guarded (a
    failure is recorded and the run goes on) and skipped when less than its need is left."""

    def __init__(self, path: Path, only: str, deadline: float = 1e9) -> None:
        self.path, self.only, self.deadline = path, set(only.split(",")), deadline
        self.started = time.perf_counter()
        self.results: dict[str, Any] = {"env": environment()}
        path.parent.mkdir(parents=True, exist_ok=True)

    def left(self) -> float:
        return self.deadline - (time.perf_counter() - self.started)

    def wants(self, *names: str) -> bool:
        return bool(self.only & set(names))

    def save(self) -> None:
        self.results["elapsed_s"] = time.perf_counter() - self.started
        self.path.write_text(json.dumps(self.results, indent=1, default=str))

    def step(self, name: str, needs: float, fn: Callable[[], Any]) -> Any:
        if name.split(":")[0] not in self.only:
            return None
        if self.left() < needs:
            self.results[name] = {"error": f"skipped: {self.left():.0f} s left of --deadline, needs ~{needs:.0f}"}
            self.save()
            return None
        t0 = time.perf_counter()
        try:
            self.results[name] = fn()
        except Exception as err:  # a benchmark keeps going: the other figures are still worth having
            traceback.print_exc()
            self.results[name] = {"error": "".join(traceback.format_exception_only(type(err), err)).strip()}
        print(f"[{self.path.stem}] {name}: {time.perf_counter() - t0:.1f} s", flush=True)
        self.save()
        return self.results[name]
