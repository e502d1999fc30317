"""Reproducibility: does the same gate give the same figures run to run on a GPU, and where and why
would two identical greedy decodes part?

`gate`: one run of the 8B-shaped FP8 gate into a fresh folder (the same gate as `end_to_end.py`'s
`e2e`: the 8B Llama layout with random weights, seed 0, bf16, CUDA; an FP8 fake-quant candidate from
512 × 512 calibration tokens; gates 1–3 at their default budgets; the reference's generations computed
in the run; diagnostics on; thresholds loose), qval's deterministic mode configured first, before CUDA
starts (`QVAL_DETERMINISTIC=0` runs without it). Run it in two processes and compare the reports:

    python3 benchmarks/reproducibility.py gate --tokenizer .tok --work /tmp/g1 --report OUT/run1.json
    python3 benchmarks/reproducibility.py gate --tokenizer .tok --work /tmp/g2 --report OUT/run2.json
    python3 benchmarks/compare_reports.py OUT/run1.json OUT/run2.json

`probe`: one process of the decode experiment: the 8B layout, the long-generation prompts (8, chat
template, left-padded in one batch of 8), greedy, EOS suppressed, `--tokens` new tokens, through qval's
own engines — the reference on the static path (CUDA graph) twice with one engine, once with a fresh
engine, once without the graph; with `--candidate`, an FP8 fake-quant candidate twice; the reference's
prefill logits, kept for the comparison between processes; with `--kernels`, each kernel kind of a
decode step run repeatedly on the same inputs (SDPA backends at the prefill and decode shapes, the
decode's matmuls), distinct results counted; with `--profile`, the kernels of one eager prefill and
decode step; with `--localise N`, two hooked eager decodes of N tokens and the first module whose output
differs while its input is the same; with `--fixes`, each candidate setting applied process-wide and
three decodes each. `--det off|cublas|full` sets the process's numerics before CUDA starts
(`cublas` = CUBLAS_WORKSPACE_CONFIG only, `full` = everything qval sets). Then `compare` writes what agrees:

    python3 benchmarks/reproducibility.py probe --tag a --det off --out OUT --tokenizer .tok --candidate --kernels
    python3 benchmarks/reproducibility.py probe --tag b --det off --out OUT --tokenizer .tok --candidate
    python3 benchmarks/reproducibility.py compare OUT/a.json OUT/b.json      # writes OUT/compare.json

`--smoke` (gate) and `--shape smoke` (probe) run the scripts' logic on a CPU (toy model).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]


def set_numerics(level: str) -> None:
    """Before torch touches CUDA: `off` leaves torch's defaults, `cublas` sets only the cuBLAS
    workspace, `full` is qval's deterministic mode."""
    if level == "cublas":
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
    elif level == "full":
        from qval import determinism

        determinism.configure("cuda", enabled=True)


def first_divergence(a: list[list[int]], b: list[list[int]]) -> list[int | None]:
    """Per row, the first step where the two token lists differ (None: identical)."""
    out: list[int | None] = []
    for x, y in zip(a, b):
        step = next((i for i, (p, q) in enumerate(zip(x, y)) if p != q), None)
        if step is None and len(x) != len(y):
            step = min(len(x), len(y))
        out.append(step)
    return out


def digest(t: Any) -> str:
    import torch

    return hashlib.sha256(t.detach().to(torch.float32).cpu().numpy().tobytes()).hexdigest()[:16]


def kernel_repeats(device: str, reps: int = 30) -> dict[str, Any]:
    """Each kernel of a decode step on fixed inputs, `reps` times: how many distinct results."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    g = torch.Generator(device=device).manual_seed(0)
    out: dict[str, Any] = {}

    def count(name: str, fn: Any) -> None:
        try:
            first = fn()
            seen = {digest(first)}
            worst = 0.0
            for _ in range(reps - 1):
                r = fn()
                seen.add(digest(r))
                worst = max(worst, float((r.float() - first.float()).abs().max()))
            out[name] = {"distinct": len(seen), "max_abs_diff": worst}
        except Exception as err:  # a backend that does not take these inputs
            out[name] = {"error": f"{type(err).__name__}: {str(err).splitlines()[0][:160]}"}

    bf = torch.bfloat16
    for label, (b, q_len, kv_len) in {"decode": (8, 1, 2304), "prefill": (8, 64, 2304)}.items():
        q = torch.randn(b, 32, q_len, 128, device=device, dtype=bf, generator=g)
        k = torch.randn(b, 32, kv_len, 128, device=device, dtype=bf, generator=g)
        v = torch.randn(b, 32, kv_len, 128, device=device, dtype=bf, generator=g)
        mask = torch.zeros(b, 1, q_len, kv_len, dtype=torch.bool, device=device)
        mask[:, :, :, : kv_len // 3] = True
        mask[0, :, :, :5] = False  # left padding in one row
        for backend in (SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH):
            def run(backend: Any = backend) -> Any:
                with sdpa_kernel([backend]):
                    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            count(f"sdpa_{label}_{backend.name.lower()}", run)

        def default(q: Any = q, k: Any = k, v: Any = v, mask: Any = mask) -> Any:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        count(f"sdpa_{label}_default", default)
    for m, n, kk in ((8, 14336, 4096), (8, 4096, 14336), (8, 128256, 4096), (8, 6144, 4096), (512, 14336, 4096)):
        a = torch.randn(m, kk, device=device, dtype=bf, generator=g)
        w = torch.randn(n, kk, device=device, dtype=bf, generator=g)
        count(f"linear_{m}x{kk}x{n}", lambda a=a, w=w: F.linear(a, w))
    return out


def profile_kernels(engine: Any, ids: Any, mask: Any, tokens: int) -> dict[str, Any]:
    """Kernel names (with counts) of one eager static decode: prefill + a few steps."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from qval.engines.hf import StaticDecoder

    dec = StaticDecoder(engine.model, ids.shape[0], 2304, tokens, engine.eos_ids(), True, use_graph=False)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        dec.run(ids, mask)
        torch.cuda.synchronize()
    names: dict[str, int] = {}
    for e in prof.events():
        if e.device_type.name == "CUDA":
            key = e.name[:120]
            names[key] = names.get(key, 0) + 1
    keep = {k: v for k, v in names.items() if any(s in k.lower() for s in ("attn", "fmha", "flash", "sdpa", "cudnn", "gemm",
                                                                            "gemv", "cutlass", "sm90", "splitk", "reduce"))}
    return dict(sorted(keep.items(), key=lambda kv: -kv[1]))


def localise(engine: Any, prompts: list[list[int]], steps: int) -> dict[str, Any]:
    """Two eager static decodes of the same batch with every module's input and output kept
    (prefill and the first `steps` − 1 steps): the first module, in execution order, whose
    output differs between the two while its input was the same is where the runs part."""
    import torch

    from qval.engines.hf import StaticDecoder, left_pad

    ids, mask = left_pad(prompts, engine.pad_id(), engine.device)
    names = {m: n or "<root>" for n, m in engine.model.named_modules()}

    def first_tensor(args: tuple, kwargs: dict) -> Any:
        for a in (*args, kwargs.get("hidden_states"), *kwargs.values()):
            if isinstance(a, torch.Tensor) and a.is_floating_point():
                return a
        return None

    def record() -> list[tuple[str, Any, Any]]:
        kept: list[tuple[str, Any, Any]] = []

        def hook(mod: Any, args: tuple, kwargs: dict, out: Any) -> None:
            o = out[0] if isinstance(out, tuple) else getattr(out, "logits", out)
            i = first_tensor(args, kwargs)
            if isinstance(o, torch.Tensor):
                kept.append((names[mod], None if i is None else i.detach().clone(), o.detach().clone()))

        handles = [m.register_forward_hook(hook, with_kwargs=True) for m in engine.model.modules()]
        try:
            dec = StaticDecoder(engine.model, len(prompts), 512, steps, engine.eos_ids(), True, use_graph=False)
            dec.run(ids, mask)
        finally:
            for h in handles:
                h.remove()
        return kept

    a, b = record(), record()
    per_forward = len(a) // steps if steps else len(a)
    out: dict[str, Any] = {"modules_per_forward": per_forward, "records": len(a), "first": None, "first_by_kind": {}}
    for idx, ((na, ia, oa), (nb, ib, ob)) in enumerate(zip(a, b)):
        same_in = ia is None or (ia.shape == ib.shape and torch.equal(ia, ib))
        if oa.shape != ob.shape or torch.equal(oa, ob):
            continue
        d = (oa.float() - ob.float()).abs()
        entry = {"module": na, "forward": idx // per_forward if per_forward else None, "input_identical": same_in,
                 "max_abs_diff": float(d.max()), "differing_elements": int((d > 0).sum()), "elements": d.numel(),
                 "max_abs_value": float(oa.float().abs().max())}
        kind = na.split(".")[-1]
        if same_in and kind not in out["first_by_kind"]:
            out["first_by_kind"][kind] = entry
        if out["first"] is None:
            out["first"] = entry
        if same_in and "first_with_same_input" not in out:
            out["first_with_same_input"] = entry
        if len(out["first_by_kind"]) >= 6:
            break
    # the logits of every forward: how far apart the two runs are before their tokens part
    heads = [(x, y) for x, y in zip(a, b) if x[0] == "lm_head"]
    out["logits_max_abs_diff_per_forward"] = [float((x[2].float() - y[2].float()).abs().max()) for x, y in heads]
    return out


def fix_trials(model: Any, tok: Any, prompts: list[list[int]], tokens: int, left: Any,
               only: list[str] | None = None) -> dict[str, Any]:
    """Each candidate setting, applied process-wide: three graph decodes (one engine twice, a
    fresh engine once); identical when all three give the same tokens."""
    import torch

    from qval import determinism
    from qval.engines.hf import HFEngine

    cuda = torch.backends.cuda
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)

    def base(algos: bool, attention: str = "torch-default", reduced: bool = True) -> None:
        torch.use_deterministic_algorithms(algos, warn_only=True)
        torch.utils.deterministic.fill_uninitialized_memory = False
        determinism.ATTENTION[attention]()
        cuda.matmul.allow_bf16_reduced_precision_reduction = reduced

    trials = {
        "torch-default": lambda: base(False),
        "qval-on": lambda: base(True, determinism.DEFAULT_ATTENTION),
        "no-cudnn, no deterministic algorithms": lambda: base(False, "no-cudnn"),
        "math": lambda: base(False, "math"),
        "bf16-reduced-precision-off": lambda: base(False, reduced=False),
    }
    wanted = trials if only is None else {k: v for k, v in trials.items() if k in only}
    out: dict[str, Any] = {}
    for name, apply in wanted.items():
        if left() < 25 or (name in ("math", "bf16-reduced-precision-off") and out.get("qval-on", {}).get("identical")):
            out[name] = {"skipped": "deadline" if left() < 25 else "qval-on was identical already"}
            continue
        apply()
        eng = HFEngine(model, tok)
        runs, secs = [], []
        for e in (eng, eng, HFEngine(model, tok)):
            sync()
            t0 = time.perf_counter()
            runs.append(e.generate(prompts, tokens, suppress_eos=True, batch_size=len(prompts)).tokens)
            sync()
            secs.append(round(time.perf_counter() - t0, 3))
        div = [first_divergence(runs[0], r) for r in runs[1:]]
        out[name] = {"identical": all(x is None for d in div for x in d), "first_divergence": div, "seconds": secs}
        print(f"[fixes] {name}: identical={out[name]['identical']} {secs}", flush=True)
    base(False)
    return out


def probe(args: argparse.Namespace) -> dict[str, Any]:
    set_numerics(args.det)
    import torch

    if args.nojit:
        from modelopt.torch.quantization import extensions

        for getter in (extensions.get_cuda_ext, extensions.get_cuda_ext_fp8, extensions.get_cuda_ext_mx):
            getter.extension = None
    from lib import setup, shapes

    from qval import determinism
    from qval.engines.hf import HFEngine, left_pad
    from qval.reference import render_prompts

    started = time.perf_counter()
    left = lambda: args.deadline - (time.perf_counter() - started)  # noqa: E731
    device = "cuda" if torch.cuda.is_available() else "cpu"
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    res: dict[str, Any] = {"tag": args.tag, "det": args.det, "determinism": determinism.describe(),
                           "cublas_env": os.environ.get("CUBLAS_WORKSPACE_CONFIG"), "env": setup.environment(), "runs": {},
                           "seconds": {}}
    tok = setup.load_tokenizer(args.tokenizer)
    work = Path(args.work)
    loaded = shapes.random_llama(args.shape, tok, device, torch.bfloat16, work / f"model_{args.shape}")
    records = [json.loads(line) for line in (ROOT / "calib_data/longgen_prompts.jsonl").read_text(encoding="utf-8").splitlines()
               if line.strip()]
    prompts, _ = render_prompts(tok, [r["prompt"] for r in records])
    prompts = prompts[: args.batch]
    ref = HFEngine(loaded.model, tok)
    res["decode_path"] = ref.decode_path()
    if args.localise:
        t0 = time.perf_counter()
        res["localise"] = localise(ref, prompts, args.localise)
        res["seconds"]["localise"] = round(time.perf_counter() - t0, 2)
        print(f"[probe {args.tag}] localise: {json.dumps(res['localise'].get('first_with_same_input'))}", flush=True)
    if args.fixes:
        res["fixes"] = fix_trials(loaded.model, tok, prompts, args.tokens, left, args.only)
        res["wall_s"] = round(time.perf_counter() - started, 1)
        return res

    def gen(name: str, engine: Any) -> None:
        if left() < 20:
            res["runs"][name] = {"skipped": "deadline"}
            return
        sync()
        t0 = time.perf_counter()
        g = engine.generate(prompts, args.tokens, suppress_eos=True, batch_size=args.batch)
        sync()
        res["seconds"][name] = round(time.perf_counter() - t0, 3)
        res["runs"][name] = g.tokens
        if engine.decode_path() == "static":  # the decoder that generation used (the engine keeps it)
            dec = engine.static_decoder(args.batch, max(len(p) for p in prompts) + args.tokens + 1, args.tokens, engine.eos_ids(), True)
            if dec.graph_error:
                res.setdefault("graph_errors", {})[name] = dec.graph_error
        print(f"[probe {args.tag}] {name}: {res['seconds'][name]} s", flush=True)

    if args.kernels and device == "cuda":
        t0 = time.perf_counter()
        res["kernels"] = kernel_repeats(device)
        res["seconds"]["kernels"] = round(time.perf_counter() - t0, 2)
    gen("ref_static_a", ref)
    gen("ref_static_b", ref)
    gen("ref_static_fresh", HFEngine(loaded.model, tok))
    # the same decoder without a graph: eager static steps
    eager = HFEngine(loaded.model, tok)
    dec = eager.static_decoder(args.batch, max(len(p) for p in prompts) + args.tokens + 1, args.tokens, eager.eos_ids(), True)
    dec.use_graph = False
    gen("ref_static_eager", eager)
    # prefill logits, for the comparison across processes
    ids, mask = left_pad(prompts, ref.pad_id(), device)
    with torch.no_grad():
        logits = loaded.model(input_ids=ids, attention_mask=mask, use_cache=False, logits_to_keep=1).logits[:, -1].float().cpu()
    work.mkdir(parents=True, exist_ok=True)
    torch.save(logits, work / "prefill_logits.pt")
    res["work"] = str(work)
    res["prefill_digest"] = digest(logits)
    if args.profile and device == "cuda":
        res["profile"] = profile_kernels(ref, ids, mask, 4)
    if args.candidate and left() > 60:
        data = {"calib": ROOT / "calib_data/general_mix.jsonl", "heldout": ROOT / "calib_data/heldout_eval.jsonl"}
        spec = {"source": "path", "path": str(work / f"model_{args.shape}"), "dtype": "bfloat16"}
        cfg = setup.gate_config("probe", spec, data, work / "reports", {"calib": (16, 512), "gate": {}})
        t0 = time.perf_counter()
        cand = setup.calibrate_and_build(loaded, cfg).candidate
        res["seconds"]["candidate_build"] = round(time.perf_counter() - t0, 2)
        res["candidate"] = cand.describe()
        gen("cand_static_a", cand)
        gen("cand_static_b", cand)
    res["wall_s"] = round(time.perf_counter() - started, 1)
    return res


def compare(files: list[Path]) -> dict[str, Any]:
    """Every run of every process against the same process's `ref_static_a`/`cand_static_a`,
    each process against the first one with the same `--det`, and the prefill logits."""
    import torch

    blobs = [json.loads(f.read_text()) for f in files]
    out: dict[str, Any] = {"processes": [b["tag"] for b in blobs], "det": {b["tag"]: b["det"] for b in blobs}, "within": {},
                           "across": {}, "prefill": {}, "seconds": {b["tag"]: b["seconds"] for b in blobs}}
    for b in blobs:
        runs = b["runs"]
        for base in ("ref_static_a", "cand_static_a"):
            if not isinstance(runs.get(base), list):
                continue
            for name, toks in runs.items():
                if name != base and name.split("_")[0] == base.split("_")[0] and isinstance(toks, list):
                    out["within"][f"{b['tag']}:{base} vs {name}"] = first_divergence(runs[base], toks)
    by_det: dict[str, list[dict[str, Any]]] = {}
    for b in blobs:
        by_det.setdefault(b["det"], []).append(b)
    for det, group in by_det.items():
        for other in group[1:]:
            for name in ("ref_static_a", "ref_static_eager", "cand_static_a"):
                x, y = group[0]["runs"].get(name), other["runs"].get(name)
                if isinstance(x, list) and isinstance(y, list):
                    out["across"][f"{det}: {group[0]['tag']} vs {other['tag']} {name}"] = first_divergence(x, y)
    for other in blobs[1:]:  # every process against the first, whatever its settings
        for name in ("ref_static_a", "cand_static_a"):
            x, y = blobs[0]["runs"].get(name), other["runs"].get(name)
            if isinstance(x, list) and isinstance(y, list):
                out["across"][f"{blobs[0]['tag']} ({blobs[0]['det']}) vs {other['tag']} ({other['det']}) {name}"] = first_divergence(x, y)
    logits = [Path(b.get("work", "")) / "prefill_logits.pt" for b in blobs]
    first = torch.load(logits[0]) if logits[0].is_file() else None
    for p, b in zip(logits, blobs):
        entry: dict[str, Any] = {"digest": b.get("prefill_digest")}
        if first is not None and p.is_file():
            entry["max_abs_diff_vs_first"] = float((torch.load(p) - first).abs().max())
        out["prefill"][b["tag"]] = entry
    return out


def gate(args: argparse.Namespace) -> int:
    """One run of the gate into a fresh folder; its report.json copied to --report."""
    import shutil

    t_start = time.perf_counter()
    import torch

    from qval import determinism

    device = "cuda" if torch.cuda.is_available() else "cpu"
    determinism.configure(device)  # before any CUDA work: the cuBLAS workspace is fixed when its handle is made

    from lib import setup

    plan = setup.SMOKE if args.smoke else setup.FULL
    shape = "smoke" if args.smoke else "8b"
    work = Path(args.work)
    if work.exists():
        shutil.rmtree(work)
    tok = setup.load_tokenizer(args.tokenizer)
    data = setup.bench_data(plan, tok, work, plan["gate"].get("agreement", {}).get("tokens", 65536))
    loaded, spec = setup.load_shape(shape, tok, device, work)
    cfg = setup.gate_config(f"bench-{shape}-e2e", spec, data, work / "reports", plan, diagnostics="on")
    if device == "cuda":
        jit = setup.prebuild_fp8_kernel()
        print(f"[gate] FP8 kernel ready in {jit['seconds']:.1f}s (built={jit['built']})", flush=True)
    facts = setup.end_to_end(loaded, cfg)
    report = Path(cfg.report.dir) / cfg.name / "report.json"
    Path(args.report).parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(report, args.report)
    print(f"[gate] run_gate {facts['wall_s']:.1f}s, approved={facts['approved']}; process {time.perf_counter() - t_start:.1f}s; "
          f"determinism {json.dumps(determinism.describe())}", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="what", required=True)
    g = sub.add_parser("gate", help="one run of the 8B-shaped FP8 gate into a fresh folder, deterministic mode on")
    g.add_argument("--tokenizer", default=None, help="tokenizer folder (default: the built-in model's)")
    g.add_argument("--work", required=True, help="a fresh scratch folder (removed first if it exists)")
    g.add_argument("--report", required=True, help="where to copy the run's report.json")
    g.add_argument("--smoke", action="store_true", help="the toy shape and smoke budgets (a CPU, a minute or two)")
    p = sub.add_parser("probe", help="one process of the greedy-decode experiment")
    p.add_argument("--tag", default="a")
    p.add_argument("--det", choices=("off", "cublas", "full"), default="off")
    p.add_argument("--out", default="probe_out")
    p.add_argument("--work", default=None, help="scratch (default /tmp/probe_work/TAG)")
    p.add_argument("--tokenizer", default=None)
    p.add_argument("--shape", default="8b")
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--candidate", action="store_true")
    p.add_argument("--kernels", action="store_true")
    p.add_argument("--profile", action="store_true")
    p.add_argument("--nojit", action="store_true", help="ModelOpt's eager FP8 path (no JIT build)")
    p.add_argument("--deadline", type=float, default=150.0)
    p.add_argument("--localise", type=int, default=0, help="hooked eager decodes of this many tokens, twice: where they part")
    p.add_argument("--fixes", action="store_true", help="try each candidate setting (three decodes each), then stop")
    p.add_argument("--only", nargs="+", default=None, help="with --fixes: these trials only")
    c = sub.add_parser("compare", help="what agrees between probe processes")
    c.add_argument("files", nargs="+", type=Path)
    args = ap.parse_args(argv)
    if args.what == "gate":
        return gate(args)
    if args.what == "compare":
        result = compare(args.files)
        text = json.dumps(result, indent=1)
        print(text)
        (args.files[0].parent / "compare.json").write_text(text)
        return 0
    Path(args.out).mkdir(parents=True, exist_ok=True)
    args.work = args.work or f"/tmp/probe_work/{args.tag}"
    res = probe(args)
    (Path(args.out) / f"{args.tag}.json").write_text(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
