"""Measurements: the hardware ceilings, decode speed, and gate-1 scoring throughput.

Every figure is a median of repeated runs after a warm-up, timed on the host after a device
sync (the work under test includes host code, so device events alone would flatter it).
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any, Callable

import torch


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(fn: Callable[[], Any], device: str, reps: int, warmup: int = 1) -> list[float]:
    """Wall seconds of `reps` calls of `fn` after `warmup` untimed ones."""
    for _ in range(warmup):
        fn()
    sync(device)
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync(device)
        out.append(time.perf_counter() - t0)
    return out


def median(xs: list[float]) -> float:
    return float(statistics.median(xs))


def hbm_bandwidth(device: str, gib: float = 2.0, reps: int = 20) -> dict[str, Any]:
    """Device-to-device copy of a random bf16 buffer; bandwidth counts bytes read + written
    (the method every roofline here uses). On a CPU: the same copy through main memory."""
    n = int(gib * (1 << 30)) // 2
    src = torch.empty(n, dtype=torch.bfloat16, device=device).normal_()
    dst = torch.empty_like(src)
    secs = timed(lambda: dst.copy_(src), device, reps, warmup=3)
    bw = 2 * src.numel() * 2 / median(secs)
    del src, dst
    return {"buffer_gib": gib, "reps": reps, "median_s": median(secs), "bytes_per_s": bw, "tb_per_s": bw / 1e12}


def matmul_tflops(device: str, n: int = 8192, reps: int = 10) -> dict[str, Any]:
    """n×n×n bf16 matrix product on random data."""
    a = torch.randn(n, n, dtype=torch.bfloat16, device=device)
    b = torch.randn(n, n, dtype=torch.bfloat16, device=device)
    secs = timed(lambda: a @ b, device, reps, warmup=3)
    return {"n": n, "median_s": median(secs), "tflops": 2 * n**3 / median(secs) / 1e12}


def batch_of(prompts: list[list[int]], batch: int) -> list[list[int]]:
    return [prompts[i % len(prompts)] for i in range(batch)]


def decode_speed(engine: Any, prompts: list[list[int]], batch: int, new_tokens: int, reps: int, path: str) -> dict[str, Any]:
    """Greedy decode of `batch` prompts × `new_tokens` on one path; ms per step includes the
    prefill (one step's worth at these prompt lengths) spread over the steps."""
    engine.decode = path
    group = batch_of(prompts, batch)
    dev = engine.device
    secs = timed(lambda: engine.generate(group, new_tokens, suppress_eos=True, batch_size=batch), dev, reps, warmup=1)
    t = median(secs)
    return {"path": path, "batch": batch, "new_tokens": new_tokens, "reps": reps, "median_s": t,
            "ms_per_step": 1000 * t / new_tokens, "tokens_per_s": batch * new_tokens / t}


def greedy_identity(engine: Any, prompts: list[list[int]], batch: int, new_tokens: int) -> dict[str, Any]:
    """Do the plain and static paths emit the same greedy tokens? Per row: the first step
    where they differ (None: identical)."""
    group = batch_of(prompts, batch)
    engine.decode = "plain"
    plain = engine.generate(group, new_tokens, suppress_eos=True, batch_size=batch)
    engine.decode = "static"
    static = engine.generate(group, new_tokens, suppress_eos=True, batch_size=batch)
    engine.decode = "auto"
    first = [next((i for i, (a, b) in enumerate(zip(p, s)) if a != b), None) for p, s in zip(plain.tokens, static.tokens)]
    same = sum(1 for f in first if f is None)
    return {"batch": batch, "new_tokens": new_tokens, "rows_identical": same, "rows": len(first), "first_divergence": first,
            "plain_nonfinite": plain.first_nonfinite_step, "static_nonfinite": static.first_nonfinite_step}


def decode_suite(engine: Any, prompts: list[list[int]], weight_bytes: int, bandwidth: float, *, batches: tuple[int, ...],
                 plain_batches: tuple[int, ...], plain_tokens: int, static_tokens: int, reps: int) -> dict[str, Any]:
    """Plain vs static decode at each batch, against the memory roofline at batch 1."""
    roofline_ms = 1000 * weight_bytes / bandwidth
    rows = []
    for b in plain_batches:
        rows.append(decode_speed(engine, prompts, b, plain_tokens, reps, "plain"))
    for b in batches:
        rows.append(decode_speed(engine, prompts, b, static_tokens, reps, "static"))
    engine.decode = "auto"
    for r in rows:
        r["x_roofline"] = r["ms_per_step"] / roofline_ms
    return {"weight_bytes": weight_bytes, "roofline_ms_per_step": roofline_ms, "rows": rows,
            "decode_notes": list(getattr(engine, "notes", []))}


def scoring(ref: Any, cand: Any, tokenizer: Any, make_config: Callable[[int], Any], folder: Path,
            budgets: tuple[int, ...], reps: int) -> dict[str, Any]:
    """Gate 1 as qval runs it (both models, metrics, per-position arrays written) against the
    same chunks through the two models' forward passes alone; peak memory per token budget."""
    from qval.gates.base import GateContext
    from qval.gates.agreement import run as agreement

    dev = ref.device
    out: dict[str, Any] = {"budgets": []}
    for budget in budgets:
        cfg = make_config(budget)
        ctx = GateContext(config=cfg, reference=ref, candidate=cand, tokenizer=tokenizer, folder=folder / f"gate1_{budget}")
        ctx.folder.mkdir(parents=True, exist_ok=True)
        chunks, info = agreement.scored_chunks(ctx)
        g = cfg.gates.agreement

        def plain() -> None:
            for b0 in range(0, len(chunks), g.batch_size):
                x = torch.tensor(chunks[b0 : b0 + g.batch_size])
                lr = ref.logits(x)
                lc = cand.logits(x)
                del lr, lc

        def gate() -> None:
            result = agreement.run(ctx)
            if result.status != "ok":
                raise RuntimeError(f"gate 1 did not finish: {result.status} {result.error}")

        if dev.startswith("cuda"):
            torch.cuda.empty_cache()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
        t_gate = timed(gate, dev, reps, warmup=1)
        peak = torch.cuda.max_memory_allocated() - base if dev.startswith("cuda") else None
        t_plain = timed(plain, dev, reps, warmup=0)
        tokens = len(chunks) * g.ctx
        out["budgets"].append({
            "tokens_requested": budget, "chunks": len(chunks), "tokens": tokens, "ctx": g.ctx, "batch": g.batch_size,
            "scored_positions": len(chunks) * info["scored_per_chunk"],
            "gate_s": median(t_gate), "plain_s": median(t_plain),
            "gate_tokens_per_s": tokens / median(t_gate), "plain_tokens_per_s": tokens / median(t_plain),
            "ratio": median(t_plain) / median(t_gate), "peak_bytes_above_models": peak,
        })
    return out


def _kind(name: str) -> str:
    n = name.lower()
    if any(k in n for k in ("fmha", "flash", "attention", "attn")):  # first: the mem-efficient kernel is a CUTLASS one
        return "attention"
    if any(k in n for k in ("gemm", "gemv", "cutlass", "nvjet", "xmma", "cublas", "splitk", "grouped_kernel", "gate_up_kernel",
            "grouped_rows_kernel", "gate_up_rows_kernel")):
        return "matmul"
    return "other"


def step_profile(engine: Any, prompts: list[list[int]], batch: int, new_tokens: int, weight_bytes: int,
                 bandwidth: float) -> dict[str, Any]:
    """Where a static decode step's time goes, from the device's own kernel records (graph
    replays included): kernels per step and device time per step by kind, against the wall
    time. Matmul time over the weight bytes says how close the GEMVs run to the bandwidth; the
    count and time of the other kernels is what the graph cannot remove."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    if not engine.device.startswith("cuda"):
        return {"skipped": "the kernel profile needs a CUDA device"}
    engine.decode = "static"
    group = batch_of(prompts, batch)
    engine.generate(group, new_tokens, suppress_eos=True, batch_size=batch)  # capture outside the profile
    sync(engine.device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        engine.generate(group, new_tokens, suppress_eos=True, batch_size=batch)
        sync(engine.device)
        wall = time.perf_counter() - t0
    engine.decode = "auto"
    kinds: dict[str, dict[str, float]] = {}
    for e in prof.events():
        if e.device_type != DeviceType.CUDA:
            continue
        k = kinds.setdefault(_kind(e.name), {"kernels": 0, "us": 0.0})
        k["kernels"] += 1
        k["us"] += e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
    per_step = {k: {"kernels_per_step": v["kernels"] / new_tokens, "ms_per_step": v["us"] / 1000 / new_tokens} for k, v in kinds.items()}
    mm = per_step.get("matmul", {}).get("ms_per_step", float("nan"))
    busy = sum(v["ms_per_step"] for v in per_step.values())
    return {"batch": batch, "new_tokens": new_tokens, "wall_ms_per_step": 1000 * wall / new_tokens, "device_busy_ms_per_step": busy,
            "by_kind": per_step, "matmul_tb_per_s": weight_bytes / (mm / 1000) / 1e12 if mm == mm and mm > 0 else None,
            "roofline_ms_per_step": 1000 * weight_bytes / bandwidth,
            "top_kernels": [(e.key[:80], e.count, round(e.device_time_total / max(e.count, 1), 2))
                            for e in sorted((a for a in prof.key_averages() if a.device_type == DeviceType.CUDA),
                                            key=lambda a: -a.device_time_total)[:12]]}
