"""`fakequant`: ModelOpt's simulated quantization in PyTorch, on CPU or GPU.

The candidate is a copy of the reference with the calibrated quantizers restored. Weights are
then folded (quantized once, in place, and their quantizers switched off): the logits are
bit-identical to quantizing them on every forward, and decoding is ~30 % faster on CPU.
Activations and the KV cache are still quantized on every forward, as the deployment would.
FP8 linears then run a lean forward with ModelOpt's own arithmetic (`leanfp8.py`; on a GPU one fused
kernel per linear), checked bit-identical when the engine is built: part of qval's decode runtime, so
with `engine.options.runtime: transformers` they run ModelOpt's own forward.
"""

from __future__ import annotations

from ..quantize.modelopt_adapter import fold_weights, restore_state
from . import leanfp8
from .base import BuildContext
from .hf import HFEngine, probe_ids
from .runtime import option


class FakeQuantEngine(HFEngine):
    backend = "fakequant"


def build_fakequant(ctx: BuildContext) -> FakeQuantEngine:
    model = ctx.reference_weights()
    notes = ["simulated quantization (ModelOpt fake quant): quantize-dequantize in high precision"]
    quantized = ctx.config.quant.has_quantizers  # weights, or a KV-cache-only candidate's K/V
    runtime = option(ctx.config.engine)
    if quantized:
        if ctx.calib_state is None:
            raise RuntimeError("fakequant needs a calibrated state; the calibrate stage did not run")
        model = restore_state(model, ctx.calib_state)
        fold_weights(model)
        gpu = ctx.reference.device.startswith("cuda")
        if runtime == "qval" and (gpu or ctx.reference.device.startswith("cpu")):
            model.eval()
            count, why = leanfp8.install(model, probe_ids(model, 48), gpu=gpu)
            notes += leanfp8.describe(count, gpu) + ([why] if why else [])
    model.eval()
    engine = FakeQuantEngine(model, ctx.reference.tokenizer, notes=notes, runtime=runtime)
    if quantized:
        engine.prequantize_kv()
    return engine
