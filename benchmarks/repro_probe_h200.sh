#!/usr/bin/env bash
# One device call (issue 12 part 7): benchmarks/repro_probe.py in six processes on the H200 —
# torch's defaults twice, CUBLAS_WORKSPACE_CONFIG alone twice, qval's deterministic mode twice —
# then the comparison. Run from the repository root of the device copy, sources in SRC.
# Starts no process after LIMIT seconds, so the call ends well inside its 10 minutes.
set -u
SRC=${SRC:-.gpu-src}
LIMIT=${LIMIT:-400}
OUTDIR=${OUT:-/tmp/out}
t0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/w .whl/*.whl || exit 1
export PYTHONPATH=$SRC:/tmp/w PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee $OUTDIR/log.txt
run() {  # tag det [extra args]
  local el=$(( $(date +%s) - t0 ))
  if [ $el -gt $LIMIT ]; then echo "[sh] skip $1: ${el}s elapsed" | tee -a $OUTDIR/log.txt; return; fi
  local tag=$1 det=$2; shift 2
  python3 $SRC/benchmarks/repro_probe.py --tag $tag --det $det --out $OUTDIR --tokenizer .tok --nojit --candidate \
    --deadline 120 "$@" >/tmp/$tag.log 2>&1
  grep -v -i warn /tmp/$tag.log | tail -n 12 | tee -a $OUTDIR/log.txt
  grep -i "determinis" /tmp/$tag.log | sort | uniq -c | head -n 20 | tee -a $OUTDIR/log.txt
  echo "[sh] $tag done at $(( $(date +%s) - t0 ))s" | tee -a $OUTDIR/log.txt
}
run off1 off --kernels --profile
run off2 off
run full1 full --kernels
run full2 full
run cub1 cublas
run cub2 cublas
python3 $SRC/benchmarks/repro_probe.py --compare $(ls $OUTDIR/*.json | grep -v compare) > /dev/null
python3 - <<'PY' 2>&1 | tee -a $OUTDIR/log.txt
import json, os
c = json.load(open(os.environ.get("OUT", "/tmp/out") + "/compare.json"))
for sec in ("within", "across"):
    for k, v in c[sec].items():
        d = [x for x in v if x is not None]
        print(sec, k, "identical" if not d else f"{len(d)}/{len(v)} rows differ, first at {min(d)}")
print(json.dumps(c["prefill"]))
print(json.dumps(c["seconds"]))
PY
