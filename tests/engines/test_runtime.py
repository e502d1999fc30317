"""qval's decode runtime (qval/engines/runtime.py) against the code it stands in for, on the built-in
model, on a CPU:

- with the runtime on (the default) an engine's figures are those the code gave before the runtime
  became an engine component (issue 27: transformers' sdpa patched process-wide for grouped-query
  attention, the fused step's wrappers on transformers' classes), bit for bit — the golden file
  golden/runtime_cpu.json, written from that code by `python -m tests.engines.runtime_figures`, one
  figure set a kind of CPU: the set compared is the one written with this environment (torch,
  transformers, CPU capability, threads) whose reference chunk equals the one transformers' own path
  gives here (two AVX512 CPUs can sum float32 in different orders); on a CPU no set was written on,
  the test says so and skips;
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

from tests.engines.runtime_figures import environment, figures, golden_set, machine_key

pytestmark = pytest.mark.slow

GOLDEN = Path(__file__).parent / "golden" / "runtime_cpu.json"


@pytest.fixture(scope="module")
def on(default_model, tmp_path_factory):
    return figures(default_model, tmp_path_factory.mktemp("runtime-on"))


@pytest.fixture(scope="module")
def off(default_model, tmp_path_factory):
    return figures(default_model, tmp_path_factory.mktemp("runtime-off"), runtime="transformers")


def test_the_runtime_gives_the_figures_of_the_code_before_it_bit_for_bit(on, off):
    golden = json.loads(GOLDEN.read_text(encoding="utf-8"))
    env, key = environment(), machine_key(off)  # the key from transformers' own path, not the runtime's
    written = golden_set(golden, env, key)
    if written is None:
        pytest.skip(f"no golden set was written on a CPU like this one ({env}, transformers' reference chunk {key}); "
                    f"the sets: {[(s['environment'], machine_key(s['figures'])) for s in golden['sets']]}. "
                    "Add this CPU's with the code before the runtime: tests/engines/runtime_figures.py says how")
    assert on == written["figures"]


def test_the_runtime_on_and_off_give_the_same_figures(on, off):
    for engine in on:
        for figure in on[engine]:
            assert on[engine][figure] == off[engine][figure], (engine, figure)
    assert on["reference"]["generate_b3"] != on["fp8_kvfp8"]["generate_b3"]  # the figures tell the engines apart
