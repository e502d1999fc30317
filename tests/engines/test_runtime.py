"""qval's decode runtime (qval/engines/runtime.py) against the code it stands in for, on the built-in
model, on a CPU:

- with the runtime on (the default) an engine's figures are those the code gave before the runtime
  became an engine component (issue 27: transformers' sdpa patched process-wide for grouped-query
  attention, the fused step's wrappers on transformers' classes), bit for bit — the golden file
  golden/runtime_cpu.json, written from that code by `python -m tests.engines.runtime_figures`;
- the contract: with the runtime on and off (`engine.options.runtime: transformers`: transformers'
  `generate`, its cache and attention, ModelOpt's own FP8 forward and KV-cache quantization) a
  scoring pass (a chunk, 300 positions piece by piece through the KV cache, an answer after a
  prefilled prompt) and greedy generation from left-padded batches give the same figures. Tolerance
  on a CPU: none — every logit equal bit for bit (compared as sha256 of the float32 bytes), every
  token equal. (On a GPU the static decoder's fused kernels sum in other orders: the tolerance there
  is test_runtime_gpu.py's.)

The reference engine and two FP8 fake-quant candidates: KV cache fp16 (the README's main command's
format: lean FP8 linears) and fp8 (the KV cache quantized on entry)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.engines.runtime_figures import environment, figures

pytestmark = pytest.mark.slow

GOLDEN = Path(__file__).parent / "golden" / "runtime_cpu.json"


@pytest.fixture(scope="module")
def on(default_model, tmp_path_factory):
    return figures(default_model, tmp_path_factory.mktemp("runtime-on"))


@pytest.fixture(scope="module")
def off(default_model, tmp_path_factory):
    return figures(default_model, tmp_path_factory.mktemp("runtime-off"), runtime="transformers")


def test_the_runtime_gives_the_figures_of_the_code_before_it_bit_for_bit(on):
    golden = json.loads(GOLDEN.read_text(encoding="utf-8"))
    if golden["environment"] != environment():
        pytest.skip(f"golden written on {golden['environment']}, this is {environment()}: not comparable bit for bit")
    assert on == golden["figures"]


def test_the_runtime_on_and_off_give_the_same_figures(on, off):
    for engine in on:
        for figure in on[engine]:
            assert on[engine][figure] == off[engine][figure], (engine, figure)
    assert on["reference"]["generate_b3"] != on["fp8_kvfp8"]["generate_b3"]  # the figures tell the engines apart
