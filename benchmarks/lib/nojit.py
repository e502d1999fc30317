"""Run a qval command or a benchmark script without ModelOpt's CUDA-kernel JIT build.

ModelOpt compiles its fake-quant CUDA extensions the first time a quantizer runs on a GPU
(once per machine; its time on the H200 is in RESULTS.md). On a short-lived machine that is most of
a small run. With the extensions marked unavailable, ModelOpt takes its own eager PyTorch path
(`tensor_quant.fp8_eager`: scale, clamp to ±448, cast to float8_e4m3fn and back), the same
fallback it uses on a CPU.

    python benchmarks/lib/nojit.py -m qval gate --config ...
    python benchmarks/lib/nojit.py benchmarks/realquant_vs_fakequant.py --only distance
"""

import runpy
import sys

from modelopt.torch.quantization import extensions

for getter in (extensions.get_cuda_ext, extensions.get_cuda_ext_fp8, extensions.get_cuda_ext_mx):
    getter.extension = None  # "already tried, not available": ModelOpt falls back to eager PyTorch

if len(sys.argv) > 2 and sys.argv[1] == "-m":
    sys.argv = [sys.argv[2], *sys.argv[3:]]
    runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
else:
    sys.argv = sys.argv[1:]
    runpy.run_path(sys.argv[0], run_name="__main__")
