"""Decode: greedy decode speed against the memory floor, on each path and kernel variant qval has,
and whether the variants emit the same tokens.

On a random-weight Llama layout (`--shape 8b`, bf16) or the built-in model (`--shape real`) and its
FP8 fake-quant candidate (calibrated and built through qval's pipeline), every "before" and "after"
in one process, against limits measured in it (the roofline: weight bytes a step reads ÷ the copy
bandwidth measured at the start; a step's floor adds the K/V slots it reads, every row):

- `paths`: the reference's and the candidate's ms/step on the plain path (transformers' `generate`) and
  the static path (static KV cache, one CUDA graph per 256-slot bucket) at batch 1, 8, 32;
- `identity`: where the plain and static paths' greedy tokens first differ, per row;
- `profile`: where a static step's device time goes (kernel kinds, from the profiler's own records);
- `filled`: the static step attending over the whole cache against the filled slots only
  (`HFEngine.static_filled`), batch 1 and gate 3's batch 8 × 2,048 per 256-step segment;
- `fused`: without and with the fused element-wise step (`HFEngine.static_fused`), reference;
- `candidate_fused`: the same for the FP8 candidate;
- `b1`: batch 1 without and with the GEMV kernels (the runtime's `gemv` switch);
- `b8`: gate 3's decode at batch 8 × 2,048 and batch 1: cuBLAS products and sdpa, then the 8-row
  products, then the split-KV attention kernel too (the runtime's `split_kv` switch);
- `candidate_kernels`: the FP8 candidate's decode without and with those kernels;
- `determinism`: in qval's deterministic mode, the static step's cache writes through torch's sorted
  `index_put_` and through distinct-index writes (`StaticDecoder.distinct_writes`).

The kernel and runtime switches named above are the decode runtime's own (`variant` below sets them,
one place); a variant runs on a fresh engine over the same model, so each captures its own graphs.
Run with `--deterministic` for the gate's own numerics (the mode `run_gate` sets on a GPU).

    python3 benchmarks/lib/nojit.py benchmarks/decode.py --tokenizer .tok --out DIR --only b8,b1 --deterministic
    python3 benchmarks/decode.py --smoke --out DIR --only paths,identity,fused      # anywhere, toy shape

Random weights: the figures time the step; the tokens say nothing of quality. DIR/decode.json.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

from lib import measure, setup, shapes  # noqa: E402

import qval.pipeline  # noqa: E402,F401  (import order, as the other scripts)

STEPS = "paths,identity,profile,filled,fused,candidate_fused,b1,b8,candidate_kernels,determinism"
SEGMENT = 256


def variant(engine: Any, *, filled: bool = True, fused: bool | None = True, gemv: bool = True, kernel: bool = True,
            distinct_writes: bool = True) -> Any:
    """A fresh engine over `engine`'s model with the decode runtime's switches set: attend over the
    filled slots, fuse the element-wise step, the GEMV products, the split-KV attention kernel, and the
    distinct-index cache writes of deterministic mode."""
    from qval.engines.static_decode import StaticDecoder

    new = setup.fresh_engine(engine)
    runtime = getattr(new, "runtime", None)
    if runtime is not None and hasattr(runtime, "gemv"):  # the runtime object owns its switches
        runtime.gemv, runtime.split_kv = gemv, kernel
    else:  # a runtime whose switches are module-level
        from qval.engines import decode_attention, fused_step

        fused_step.use_gemv, decode_attention.use_kernel = gemv, kernel
    StaticDecoder.distinct_writes = distinct_writes
    new.static_filled, new.static_fused = filled, fused
    return new


def first_divergence(a: list[list[int]], b: list[list[int]]) -> list[int | None]:
    return [next((i for i, (x, y) in enumerate(zip(r, s)) if x != y), None) for r, s in zip(a, b)]


def kv_bytes_per_slot(cfg: Any) -> int:
    head = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * head * 2  # K and V, bf16


def with_floors(t: dict, weight_bytes: int, batch: int, per_slot: int, bytes_per_s: float) -> dict:
    """A `timeline`'s segments against their floors: (weight bytes + every row's K/V slots a step
    of the segment reads, on average) ÷ bandwidth; and the whole generation's ratio."""
    for s in t["segments"]:
        seen = (s["context"][0] + s["context"][1]) / 2
        floor = 1000 * (weight_bytes + batch * seen * per_slot) / bytes_per_s
        s.update(floor_ms=floor, x_floor=s["ms_per_step"] / floor)
    total_floor = sum(s["floor_ms"] * (s["steps"][1] - s["steps"][0]) for s in t["segments"])
    total = sum(s["ms_per_step"] * (s["steps"][1] - s["steps"][0]) for s in t["segments"])
    t["x_floor_overall"] = total / total_floor
    return t


def timeline(engine: Any, group: list[list[int]], new_tokens: int) -> dict:
    """One warm run (captures every bucket's graph), then a timed one with a CUDA event per segment."""
    import torch

    engine.decode = "static"
    engine.generate(group, new_tokens, suppress_eos=True, batch_size=len(group))
    width = max(len(p) for p in group)
    dec = engine.static_decoder(len(group), width + new_tokens + 1, new_tokens, engine.eos_ids(), True)  # the one just used
    events: list[tuple[int, torch.cuda.Event]] = []

    def mark(done: int) -> None:
        if done % SEGMENT == 0 or done == new_tokens:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            events.append((done, e))

    dec.on_step = mark
    start = torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    start.record()
    gen = engine.generate(group, new_tokens, suppress_eos=True, batch_size=len(group))
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    dec.on_step = None
    segments, prev_done, prev = [], 1, start
    for done, e in events:
        segments.append({"steps": [prev_done, done], "context": [width + prev_done, width + done],
                         "ms_per_step": prev.elapsed_time(e) / max(done - prev_done, 1)})
        prev_done, prev = done, e
    return {"batch": len(group), "new_tokens": new_tokens, "prompt_width": width, "wall_s": wall,
            "graphs": sorted(dec.graphs), "segments": segments, "tokens": gen.tokens}


class Decode:
    """The measurements, sharing one model, its prompts and the run's floors."""

    def __init__(self, model: Any, prompts: list[list[int]], bandwidth: float, short: int, long: int, cuda: bool, reps: int = 3) -> None:
        self.prompts, self.bw, self.short, self.long, self.cuda, self.reps = prompts, bandwidth, short, long, cuda, reps
        self.wbytes = shapes.weight_bytes_per_step(model)
        self.per_slot = kv_bytes_per_slot(model.config)
        self.roof = 1000 * self.wbytes / bandwidth

    def one(self, engine: Any, batch: int) -> dict[str, Any]:
        r = measure.decode_speed(engine, self.prompts if batch > 1 else self.prompts[:1], batch, self.short, self.reps, "static")
        r["x_roofline"] = r["ms_per_step"] / self.roof
        return r

    def long_run(self, engine: Any, batch: int = 8) -> dict[str, Any]:
        group = measure.batch_of(self.prompts, batch)
        if not self.cuda:  # --smoke on a CPU: no device events, the script's own path only
            engine.decode = "static"
            return {"tokens": engine.generate(group, self.long, suppress_eos=True, batch_size=batch).tokens, "x_floor_overall": float("nan")}
        return with_floors(timeline(engine, group, self.long), self.wbytes, batch, self.per_slot, self.bw)

    def paths(self, engine: Any, plan: dict[str, Any], candidate: bool) -> dict[str, Any]:
        batches = plan["cand_batches"] if candidate else plan["batches"]
        plain = plan["cand_batches"][:1] if candidate else plan["plain_batches"]
        return measure.decode_suite(engine, self.prompts, self.wbytes, self.bw, batches=batches, plain_batches=plain,
                                    plain_tokens=plan["plain_tokens"], static_tokens=plan["static_tokens"], reps=plan["reps"])

    def profile(self, engine: Any, batch: int) -> dict[str, Any]:
        return measure.step_profile(engine, self.prompts, batch, self.short, self.wbytes, self.bw)

    def compare(self, engine: Any, variants: dict[str, dict[str, Any]], long: bool, b8_short: bool = True) -> dict[str, Any]:
        """Each variant's batch 1 (and batch 8 × short, and batch 8 × long) decode, and its tokens against the others'."""
        row: dict[str, Any] = {}
        toks, toks1 = {}, {}
        engine.decode = "plain"
        plain1 = engine.generate(self.prompts[:1], self.short, suppress_eos=True, batch_size=1).tokens[0]
        engine.decode = "auto"
        for name, knobs in variants.items():
            e = variant(engine, **knobs)
            r: dict[str, Any] = {"batch1": self.one(e, 1)}
            toks1[name] = e.generate(self.prompts[:1], self.short, suppress_eos=True, batch_size=1).tokens[0]
            r["batch1"]["first_divergence_from_plain"] = first_divergence([plain1], [toks1[name]])[0]
            if b8_short:
                r["batch8_short"] = self.one(e, 8)
            if long:
                lr = self.long_run(e)
                toks[name] = lr.pop("tokens")
                r["batch8_long"] = lr
            r["notes"], r["fused"] = list(e.notes), e.describe().get("decode_fused")
            row[name] = r
            print(f"[decode] {name}: b1 ×{r['batch1']['x_roofline']:.3f}"
                  + (f", b8 long ×{r['batch8_long']['x_floor_overall']:.3f} of its floor" if long else ""), flush=True)
            del e
        names = list(variants)
        for a, b in zip(names, names[1:]):
            row[f"{a}_vs_{b}_first_divergence_b1"] = first_divergence([toks1[a]], [toks1[b]])[0]
            if a in toks and b in toks:
                row[f"{a}_vs_{b}_first_divergence"] = first_divergence(toks[a], toks[b])
        last = variant(engine, **list(variants.values())[-1])
        row["identity_plain_vs_last"] = measure.greedy_identity(last, self.prompts, 8, min(256, self.long))
        if self.cuda:
            row["profile_b8_last"] = self.profile(last, 8)
        return row

    def determinism(self, engine: Any) -> dict[str, Any]:
        """Deterministic mode: batch 8 × short and batch 1 with the cache writes sorted and distinct; the tokens must be the same."""
        from qval import determinism

        row: dict[str, Any] = {"mode": determinism.configure("cuda" if self.cuda else "cpu")}
        toks = {}
        for distinct in (False, True):
            e = variant(engine, distinct_writes=distinct)
            for b in (8, 1):
                row[f"{'distinct' if distinct else 'sorted'}_b{b}"] = self.one(e, b)
                toks[(distinct, b)] = e.generate(measure.batch_of(self.prompts, b), self.short, suppress_eos=True, batch_size=b).tokens
            del e
        row["tokens_identical"] = {b: toks[(False, b)] == toks[(True, b)] for b in (8, 1)}
        variant(engine)  # the switches back to their defaults
        return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    setup.common_args(ap, STEPS, "decode_out")
    ap.add_argument("--new-tokens", type=int, default=2048, help="the long decode's new tokens (gate 3's 2,048)")
    ap.add_argument("--skip-before", action="store_true", help="fused, candidate_fused: only the fused variant (the before figures stand)")
    args = ap.parse_args(argv)
    dev = setup.device()
    if args.deterministic:
        from qval import determinism

        determinism.configure(dev)  # before the first CUDA work, as load_model does
    plan = setup.SMOKE if args.smoke else setup.FULL
    shape = "smoke" if args.smoke else args.shape
    short, long = (16, 48) if args.smoke else (256, args.new_tokens)
    out = Path(args.out)
    work = out / "work"
    run = setup.Run(out / "decode.json", args.only, args.deadline)
    run.results["bandwidth"] = bw = measure.hbm_bandwidth(dev, gib=0.25 if args.smoke else 2.0, reps=5 if args.smoke else 20)
    tok = setup.load_tokenizer(args.tokenizer, args.gguf if shape == "real" else None)
    loaded, spec = setup.load_shape(shape, tok, dev, work, args.gguf)
    d = Decode(loaded.model, setup.longgen_prompts(tok), bw["bytes_per_s"], short, long, dev == "cuda", 1 if args.smoke else 3)
    run.results.update(model=loaded.name, weight_bytes=d.wbytes, roofline_ms=d.roof)
    data = setup.bench_data(plan, tok, work, 2048)
    built = setup.calibrate_and_build(loaded, setup.gate_config("decode", spec, data, work / "reports", plan))
    ref, cand = built.reference, built.candidate
    before = [] if args.skip_before else [("unfused", {"fused": False})]
    run.step("paths", 120, lambda: {"reference": d.paths(ref, plan, False), "candidate": d.paths(cand, plan, True)})
    run.step("identity", 30, lambda: [measure.greedy_identity(ref, d.prompts, b, plan["identity_tokens"]) for b in (1, plan["batches"][1])])
    run.step("profile", 30, lambda: d.profile(variant(ref), 1))
    run.step("filled", 150, lambda: d.compare(ref, {"whole_cache": {"filled": False}, "filled_slots": {}}, dev == "cuda", False))
    run.step("fused", 150, lambda: d.compare(ref, dict(before + [("fused", {})]), dev == "cuda"))
    run.step("candidate_fused", 60, lambda: d.compare(cand, dict(before + [("fused", {})]), False))
    run.step("b1", 60, lambda: {**d.compare(ref, {"no_gemv": {"gemv": False}, "gemv": {}}, False, False), "profile_b1": d.profile(variant(ref), 1)})
    run.step("b8", 150, lambda: d.compare(ref, {"before": {"gemv": False, "kernel": False}, "gemv": {"kernel": False}, "gemv_kernel": {}}, True))
    run.step("candidate_kernels", 60, lambda: d.compare(cand, {"before": {"gemv": False, "kernel": False}, "after": {}}, False))
    run.step("determinism", 60, lambda: d.determinism(ref))
    variant(ref)  # the runtime's switches back to their defaults
    print({k: v for k, v in run.results.items() if k in ("bandwidth", "roofline_ms", "elapsed_s")})
    return 0


if __name__ == "__main__":
    sys.exit(main())
