"""GPU: one run of the 8B-shaped FP8 gate into a fresh folder, for the reproducibility check
(issue 12, part 7; benchmarks/RESULTS.md §12).

The same gate as `bench.py --e2e 8b` (its end-to-end step): the 8B Llama layout with random
weights (seed 0, bf16, CUDA), an FP8 fake-quant candidate (512 × 512 calibration tokens), all
three gates at their default budgets, the reference's generations computed in this run (the
folder is fresh, so is its `.reference/`), diagnostics on, thresholds loose. qval's deterministic
mode is configured first, before CUDA starts (`QVAL_DETERMINISTIC=0` runs without it).
Run it twice in two processes and compare the two reports:

    python3 benchmarks/repro_gate.py --tokenizer .tok --work /tmp/g1 --report OUT/run1.json
    python3 benchmarks/repro_gate.py --tokenizer .tok --work /tmp/g2 --report OUT/run2.json
    python3 benchmarks/compare_reports.py OUT/run1.json OUT/run2.json

`--smoke` runs the toy shape with bench.py's smoke budgets (a CPU, in a minute or two).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer", default=None, help="tokenizer folder (default: the built-in model's)")
    ap.add_argument("--work", required=True, help="a fresh scratch folder (removed first if it exists)")
    ap.add_argument("--report", required=True, help="where to copy the run's report.json")
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    t_start = time.perf_counter()

    import torch

    from qval import determinism

    device = "cuda" if torch.cuda.is_available() else "cpu"
    determinism.configure(device)  # before any CUDA work: the cuBLAS workspace is fixed when its handle is made

    import bench
    import shapes

    plan = bench.SMOKE if args.smoke else bench.FULL
    shape = "smoke" if args.smoke else "8b"
    work = Path(args.work)
    if work.exists():
        shutil.rmtree(work)
    tok = bench.load_bench_tokenizer(argparse.Namespace(tokenizer=args.tokenizer, gguf=None))
    samples, seq_len = plan["calib"]
    data = {"calib": bench.expanded_jsonl(bench.ROOT / "calib_data/general_mix.jsonl", work / "data/calib.jsonl", tok, samples * seq_len),
            "heldout": bench.expanded_jsonl(bench.ROOT / "calib_data/heldout_eval.jsonl", work / "data/heldout.jsonl", tok,
                                            plan["gate"].get("agreement", {}).get("tokens", 65536))}
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    loaded = shapes.random_llama(shape, tok, device, dtype, work / f"model_{shape}")
    spec = {"source": "path", "path": str(work / f"model_{shape}"), "dtype": "bfloat16"}
    cfg = bench.gate_config(f"bench-{shape}-e2e", spec, data, work / "reports", plan, diagnostics="on")
    if device == "cuda":
        jit = bench.prebuild_fp8_kernel()
        print(f"[gate] FP8 kernel ready in {jit['seconds']:.1f}s (built={jit['built']})", flush=True)
    facts, _ = bench.end_to_end(loaded, cfg)
    report = Path(cfg.report.dir) / cfg.name / "report.json"
    Path(args.report).parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(report, args.report)
    print(f"[gate] run_gate {facts['wall_s']:.1f}s, approved={facts['approved']}; process {time.perf_counter() - t_start:.1f}s; "
          f"determinism {json.dumps(determinism.describe())}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
