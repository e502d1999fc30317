#!/usr/bin/env bash
# benchmarks/multi_gpu.py on a machine of several GPUs (device kind nvidia-h200-x2), one call,
# carry [.whl, .tok]: the wheels into /tmp/site, ModelOpt's CUDA-extension JIT skipped in every
# process (the sweep's workers included) through a sitecustomize, then the script.
set -euo pipefail
SITE=/tmp/site
OUT="${OUT:-/tmp/out}"
[ -d "$SITE/pydantic" ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" .whl/*.whl
mkdir -p /tmp/nojit
cat > /tmp/nojit/sitecustomize.py <<'PY'
try:
    from modelopt.torch.quantization import extensions
    for getter in (extensions.get_cuda_ext, extensions.get_cuda_ext_fp8, extensions.get_cuda_ext_mx):
        getter.extension = None
except Exception:
    pass
PY
export PYTHONPATH="/tmp/nojit:$SITE:$PWD"
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader
timeout "${LIMIT:-560}" python3 benchmarks/multi_gpu.py --tokenizer .tok --out "$OUT" > "$OUT/multi_gpu.log" 2>&1 || echo "exit $?"
grep -v -i warn "$OUT/multi_gpu.log" | tail -40
