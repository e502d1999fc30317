#!/usr/bin/env bash
# One device call for issue 12 part 7 (benchmarks/RESULTS.md §12), from the repository root of
# the device copy with qval's sources in $SRC, the wheels in .whl/ and the tokenizer in .tok/:
#   1. where two identical greedy decodes part (benchmarks/repro_probe.py --localise) and which
#      settings make them identical (--fixes), ModelOpt's FP8 kernel JIT-building meanwhile;
#   2. the 8B-shaped FP8 gate (benchmarks/repro_gate.py) twice, each in its own process and fresh
#      folder, with qval's deterministic mode (QVAL_ATTENTION=math only if step 1 found the
#      default attention setting not enough and math enough);
#   3. benchmarks/compare_reports.py on the two report.json files.
# Everything lands in $OUT; no step starts that could run past ~530 s.
set -u
SRC=${SRC:-.gpu-src}
OUTDIR=${OUT:-/tmp/out}
t0=$(date +%s)
el() { echo $(( $(date +%s) - t0 )); }
log() { echo "[sh $(el)s] $*" | tee -a $OUTDIR/log.txt; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/w .whl/*.whl || exit 1
export PYTHONPATH=$SRC:/tmp/w PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee $OUTDIR/log.txt
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version())" | tee -a $OUTDIR/log.txt
python3 -c "from modelopt.torch.quantization.extensions import get_cuda_ext_fp8 as g; g(raise_if_failed=False)" >/tmp/jit.log 2>&1 &
jit=$!
log "diag start"
CUBLAS_WORKSPACE_CONFIG=:4096:8 timeout 130 python3 $SRC/benchmarks/repro_probe.py --tag diag --det off --out $OUTDIR \
  --tokenizer .tok --localise 16 --fixes --tokens 128 --deadline 110 >/tmp/diag.log 2>&1
log "diag rc=$?"
grep -E "^\[(probe|fixes)" /tmp/diag.log | cut -c1-600 | tee -a $OUTDIR/log.txt
grep -i "error\|Traceback" /tmp/diag.log | head -n 5 | tee -a $OUTDIR/log.txt
ATT=$(python3 -c "
import json
try:
    f = json.load(open('$OUTDIR/diag.json'))['fixes']
except Exception:
    f = {}
print('math' if not f.get('qval-on', {}).get('identical') and f.get('math', {}).get('identical') else '')")
[ -n "$ATT" ] && export QVAL_ATTENTION=$ATT
log "attention override: '${ATT}'"
wait $jit; log "jit done rc=$?"
for r in 1 2; do
  left=$(( 530 - $(el) ))
  if [ $left -lt 170 ]; then log "run$r skipped: ${left}s left"; continue; fi
  timeout $left python3 $SRC/benchmarks/repro_gate.py --tokenizer .tok --work /tmp/g$r --report $OUTDIR/run$r.json >/tmp/g$r.log 2>&1
  log "run$r rc=$?"
  grep -E "^\[gate\]|Error|error:" /tmp/g$r.log | cut -c1-600 | tail -n 6 | tee -a $OUTDIR/log.txt
  grep -i "determinis" /tmp/g$r.log | sort | uniq -c | head -n 8 | cut -c1-300 | tee -a $OUTDIR/log.txt
done
if [ -f $OUTDIR/run1.json ] && [ -f $OUTDIR/run2.json ]; then
  python3 $SRC/benchmarks/compare_reports.py $OUTDIR/run1.json $OUTDIR/run2.json --out $OUTDIR/compare.json | head -n 40 | tee -a $OUTDIR/log.txt
fi
log "end"
