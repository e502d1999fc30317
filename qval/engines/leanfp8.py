"""A lean forward for FP8 fake-quant linears on CPU: ModelOpt's arithmetic without its overhead.

After ModelOpt's `fold_weight` a FP8 linear's weights are already quantized and its weight quantizer is
off; what remains per call is the static per-tensor FP8 input quantizer. ModelOpt runs it through
`TensorQuantizer.forward` → `ScaledE4M3Function` → `tensorrt::quantize_op` → `fp8_eager`: about a
dozen small tensor ops and a Python dispatch chain around a handful of arithmetic ones: on a CPU
that overhead, per linear, made the fake-quant candidate's decode step markedly slower than the
reference's (the lean forward's gain: benchmarks/CHANGELOG.md, §8).

`install(model)` gives each eligible linear a forward that does exactly `fp8_eager`'s arithmetic
with the scale and its inverse computed once from the calibrated amax (the same float32 ops:
448 / amax, 1 / scale), then `F.linear` with the folded weight. It then checks itself: one batch
through the model before and after must give bit-identical logits, or every linear is put back and
the engine notes why.

On a GPU (`install(..., gpu=True)`) the same arithmetic runs as one fused kernel per linear
(`torch.compile` of `_qdq`), under the same bit-identity check: there the host overhead is gone
(the decode step is a CUDA graph) but each of ModelOpt's dozen small ops is still a kernel launch
on the device, ×7 linears × every layer, every step (an 8B FP8 candidate decoded at batch 8 far
slower than the reference: benchmarks/CHANGELOG.md, §14). Inside the static decoder's step the
product after it is gemv.py's kernel, as the reference's plain linears' are there (fused_step.py reads
the forward's `lean` operands), and q/k/v (gate/up) whose input scales are bit-equal share one
quantized input and one launch (`_group`: the three quantizers would give the same tensor; RESULTS.md
§14.4). Part of qval's decode runtime (runtime.py): the fakequant builder installs it only when the
engine's runtime is on.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from ..quantize.modelopt_adapter import quantizer_state
from . import fused_step

FP8_MAX = 448.0


def _eligible(m: torch.nn.Module) -> bool:
    iq, wq, oq = (getattr(m, n, None) for n in ("input_quantizer", "weight_quantizer", "output_quantizer"))
    if not isinstance(m, torch.nn.Linear) or iq is None or wq is None or oq is None:
        return False
    if wq.is_enabled or oq.is_enabled or not iq.is_enabled:  # folded weights, activations quantized
        return False
    s = quantizer_state(iq)
    return (
        s.num_bits == (4, 3) and s.fake_quant and s.if_quant and not s.if_calib
        and s.block_sizes is None and s.pre_quant_scale is None and not s.rotate
        and s.backend is None and not s.bias_calibration and not s.use_constant_amax and not s.dynamic
        and s.amax is not None and s.amax.numel() == 1 and float(s.amax) > 1.0 / (1 << 24)
    )


def _qdq(x: torch.Tensor, scale: torch.Tensor, scale_inv: torch.Tensor) -> torch.Tensor:
    """fp8_eager's quantize-dequantize: scale, clamp to ±448, cast to float8_e4m3fn and back, unscale."""
    q = (x.to(torch.float32) * scale).clamp_(min=-FP8_MAX, max=FP8_MAX)  # in place: fresh tensors only
    return q.to(torch.float8_e4m3fn).to(torch.float32).mul_(scale_inv).to(x.dtype)


def _lean(m: torch.nn.Module, fused: Any = None) -> Any:
    """The lean forward of one linear, its tensors bound once (a quantized module's attribute
    access goes through ModelOpt's dynamic-module machinery on every call)."""
    original = m.forward
    weight, bias = m.weight, m.bias
    amax = quantizer_state(m.input_quantizer).amax.to(torch.float32)
    scale = FP8_MAX / amax  # the same float32 ops as fp8_eager, done once
    scale_inv = 1 / scale

    def quant(x: torch.Tensor) -> torch.Tensor:
        return _qdq(x, scale, scale_inv) if x.device.type == "cpu" else fused(x, scale, scale_inv)

    def forward(x: torch.Tensor) -> torch.Tensor:
        if x.numel() == 0:
            return original(x)
        if x.device.type != "cpu" and (fused is None or x.device != scale.device):
            return original(x)
        return F.linear(quant(x), weight, bias)

    forward.modelopt_forward = original  # type: ignore[attr-defined]
    forward.lean = (quant, scale, weight, bias)  # type: ignore[attr-defined]
    return forward


QKV = fused_step.LEAN_QKV  # on a lean q projection: (k module, v module, q, k, v weights), one scale for the three
GATE_UP = fused_step.LEAN_GATE_UP  # on a lean gate projection: (its quantizer, gate weight, up weight), one scale


def _shared(mods: list[Any]) -> bool:
    """Lean linears, bias-free, one input size, bit-equal input scales: one quantized input serves them all."""
    leans = [getattr(getattr(m, "forward", None), "lean", None) for m in mods]
    if any(lean is None or lean[3] is not None for lean in leans):
        return False
    return len({lean[2].shape[1] for lean in leans}) == 1 and all(torch.equal(lean[1], leans[0][1]) for lean in leans)


def _group(model: torch.nn.Module) -> int:
    """Mark q/k/v and gate/up whose input scales are equal (ModelOpt calibrates each on the same input,
    so they normally are): inside the static decoder's step they share one quantized input and one
    launch (fused_step.py). How many groups."""
    n = 0
    for module in model.modules():
        qkv = [getattr(module, a, None) for a in ("q_proj", "k_proj", "v_proj")]
        if all(m is not None for m in qkv) and _shared(qkv):
            module.q_proj.__dict__[QKV] = (qkv[1], qkv[2], *(m.forward.lean[2] for m in qkv))
            n += 1
        gu = [getattr(module, a, None) for a in ("gate_proj", "up_proj")]
        if all(m is not None for m in gu) and _shared(gu) and gu[0].forward.lean[2].shape == gu[1].forward.lean[2].shape:
            module.gate_proj.__dict__[GATE_UP] = (gu[0].forward.lean[0], gu[0].forward.lean[2], gu[1].forward.lean[2])
            n += 1
    return n


def _restore(mods: list[torch.nn.Module]) -> None:
    for m in mods:
        m.forward = m.forward.modelopt_forward
        m.__dict__.pop(QKV, None)
        m.__dict__.pop(GATE_UP, None)


def install(model: torch.nn.Module, probe: torch.Tensor, gpu: bool = False) -> tuple[int, str | None]:
    """Lean forwards on the eligible linears; (how many, None) or (0, why not) after the self-check
    on `probe` (token ids, shape [batch, tokens]). `gpu`: the fused kernel for CUDA tensors."""
    mods = [m for m in model.modules() if _eligible(m)]
    if not mods:
        return 0, None
    with torch.no_grad():
        before = model(input_ids=probe, use_cache=False).logits
        fused = torch.compile(_qdq, dynamic=True) if gpu else None
        for m in mods:
            m.forward = _lean(m, fused)
        try:
            after = model(input_ids=probe, use_cache=False).logits
        except Exception as err:  # noqa: BLE001 - e.g. no compiler for the fused kernel: ModelOpt's forward stays
            _restore(mods)
            return 0, f"lean FP8 forward failed ({type(err).__name__}: {str(err).splitlines()[0][:200]}); ModelOpt's forward kept"
    if not torch.equal(before, after):
        _restore(mods)
        diff = (before - after).abs().max().item()
        return 0, f"lean FP8 forward not bit-identical to ModelOpt's (max |Δlogit| {diff:.3g}); ModelOpt's forward kept"
    _group(model)
    return len(mods), None


def describe(count: int, gpu: bool = False) -> list[str]:
    where = "GPU forward (one fused kernel per linear)" if gpu else "CPU forward"
    return [f"{count} FP8 linears run a lean {where}: ModelOpt's fp8_eager arithmetic with the scale computed once "
            "(bit-identical logits, checked when the engine is built)"] if count else []


