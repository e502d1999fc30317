"""`realquant`: real low-precision weights, and real low-precision GEMMs where there is a kernel.

The calibrated candidate (restored, not folded) goes through ModelOpt's `mtq.compress`, which
replaces each quantized weight by its packed low-precision tensor (FP8 E4M3 for fp8, packed
INT4 for AWQ, …) and each quantized linear by `RealQuantLinear`. A linear then runs a real
low-precision GEMM when ModelOpt's GEMM registry has one for it, and otherwise dequantizes its
stored weight and runs a float GEMM: the weights are real, the arithmetic is emulated.

Real GEMMs:
- CUDA: ModelOpt's FP8 per-tensor GEMM (`torch._scaled_mm`, compute capability >= 8.9, i.e.
  Hopper/Ada). ModelOpt 0.47 does not import that backend itself (`backends/__init__.py` only
  imports the NVFP4 one), so without the explicit import (`modelopt_adapter.compress`) it never runs.
- CPU: on request (`engine.options.cpu_fp8_gemm: scaled_mm`) qval routes FP8 linears to
  `torch._scaled_mm` itself (`install_cpu_fp8`): FP8 operands scaled exactly as on the GPU. The
  CPU has no FP8 hardware; its kernel multiplies in float32 and is far slower per call than
  the emulated linear, even for one token, so the default there is emulation.

Activations of layers without a real GEMM, and the KV cache, stay ModelOpt fake-quant.
`describe()['notes']` says, after the run, which linears ran which GEMM.
"""

from __future__ import annotations

import types
from collections import Counter
from typing import Any

import torch

from ..errors import StageError
from ..quantize.modelopt_adapter import compress, quantizer_state, real_quant_weight, restore_state
from .base import BuildContext
from .hf import HFEngine
from ..backends import RealQuantOptions  # noqa: F401  (declared with the backend's name; re-exported here)
from .runtime import option

CPU_GEMM = "qval_cpu_fp8_scaled_mm"


def cpu_fp8_ready(module: torch.nn.Module) -> bool:
    """Per-tensor FP8 weights and a per-tensor static FP8 input scale, no pre-scaling."""
    stored = real_quant_weight(module)
    if stored is None or stored[1] != "fp8":
        return False
    iq, wq = quantizer_state(module.input_quantizer), quantizer_state(module.weight_quantizer)
    return (iq.enabled and iq.num_bits == (4, 3) and iq.amax is not None and iq.amax.numel() == 1
            and iq.block_sizes is None and iq.stored_pre_quant_scale is None
            and wq.num_bits == (4, 3) and wq.scale is not None and wq.scale.numel() == 1)


def cpu_fp8_gemm(input: torch.Tensor, w_fp8: torch.Tensor, w_scale: torch.Tensor, x_amax: torch.Tensor,
                 bias: torch.Tensor | None) -> torch.Tensor:
    """y = x·Wᵀ with x and W in float8_e4m3fn: x quantized with the calibrated static scale
    (amax/448, saturating), W the stored codes with their scale, through `torch._scaled_mm`."""
    fp8 = torch.finfo(torch.float8_e4m3fn)
    scale_w = w_scale.float().reshape(())
    scale_x = (x_amax.float() / fp8.max).reshape(())
    shape = input.shape
    x = (input.reshape(-1, shape[-1]).float() / scale_x).clamp(fp8.min, fp8.max).to(torch.float8_e4m3fn)
    out = torch._scaled_mm(x, w_fp8.t(), scale_a=scale_x, scale_b=scale_w, out_dtype=torch.float32)
    if bias is not None:
        out = out + bias.float()
    return out.to(input.dtype).reshape(*shape[:-1], out.shape[-1])


def _cpu_fp8_forward(module: torch.nn.Module) -> Any:
    """The routed forward of one linear, its operands read once (the quantizers' state does not
    change after compression)."""
    w_fp8 = real_quant_weight(module)[0]  # type: ignore[index]
    w_scale = quantizer_state(module.weight_quantizer).scale
    x_amax = quantizer_state(module.input_quantizer).amax

    def forward(self: torch.nn.Module, input: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if input.is_cuda:  # the model was moved: ModelOpt's own dispatch applies
            return type(self).forward(self, input, *args, **kwargs)
        self._qval_gemm = CPU_GEMM
        return self.output_quantizer(cpu_fp8_gemm(input, w_fp8, w_scale, x_amax, self.bias))

    return types.MethodType(forward, module)


def install_cpu_fp8(model: torch.nn.Module) -> int:
    """Route every eligible FP8 linear to `cpu_fp8_gemm`. ModelOpt's own dispatch cannot be
    used on a CPU-only torch: `RealQuantLinear.forward` opens an NVTX range before any
    registered GEMM, and NVTX does not exist without CUDA. Returns the number routed."""
    n = 0
    for m in model.modules():
        if cpu_fp8_ready(m):
            m.forward = _cpu_fp8_forward(m)
            n += 1
    return n


def gemm_name(module: torch.nn.Module) -> str:
    if getattr(module, "_qval_gemm", None) == CPU_GEMM:
        return "FP8 torch._scaled_mm on CPU (float32 arithmetic inside the kernel)"
    fn = getattr(module, "_real_quant_gemm_impl", None)
    if fn is None:
        return "dequantize + float GEMM (emulated)"
    owner = getattr(fn, "__self__", None)
    return f"{getattr(owner, '__name__', '')}.{getattr(fn, '__name__', repr(fn))}".strip(".") + " (real low-precision GEMM)"


class RealQuantEngine(HFEngine):
    backend = "realquant"

    def storage(self) -> dict[str, int]:
        """Quantized linears by the dtype their weight is stored in."""
        out: Counter[str] = Counter()
        for m in self.model.modules():
            stored = real_quant_weight(m)
            if stored is not None:
                out[str(stored[0].dtype).removeprefix("torch.")] += 1
        return dict(out)

    def gemms(self) -> dict[str, int]:
        """Which GEMM each quantized linear ran (known once it has run a forward)."""
        return dict(Counter(gemm_name(m) for m in self.model.modules() if real_quant_weight(m) is not None))

    def describe(self) -> dict[str, Any]:
        d = super().describe()
        storage, gemms = self.storage(), self.gemms()
        d["weight_storage"] = storage
        d["gemms"] = gemms
        emulated = sum(n for k, n in gemms.items() if "emulated" in k)
        d["notes"] = self.notes + [
            "weights stored as " + ", ".join(f"{n} linears in {k}" for k, n in storage.items()),
            "GEMMs: " + ", ".join(f"{n} × {k}" for k, n in gemms.items()),
            *([f"{emulated} quantized linears fell back to emulation: their stored weights are dequantized and "
               f"multiplied in {d.get('dtype')}"] if emulated else []),
            "activations of emulated linears and the KV cache: ModelOpt fake quant",
        ]
        return d


def check(cfg: Any) -> None:
    if not cfg.quant.spec.quantizes:
        raise StageError(f"{cfg.source_file or cfg.name}: engine realquant needs a quantized format; quant.format {cfg.quant.format.value} has "
                          "nothing to compress (use engine: {backend: fakequant} for the identity check).")


def build_realquant(ctx: BuildContext) -> RealQuantEngine:
    check(ctx.config)
    if ctx.calib_state is None:
        raise StageError("realquant needs a calibrated state; the calibrate stage did not run")
    model = restore_state(ctx.reference_weights(), ctx.calib_state)
    compress(model)
    model.eval()
    where = "cuda" if ctx.reference.device.startswith("cuda") else "cpu"
    notes = [f"real quantization (ModelOpt mtq.compress) on {where}"]
    if where == "cpu":
        options = RealQuantOptions.model_validate(ctx.config.engine.options)
        if options.cpu_fp8_gemm == "scaled_mm":
            install_cpu_fp8(model)
            notes.append("CPU: FP8 GEMMs through torch._scaled_mm, whose CPU kernel multiplies the FP8 operands in float32 "
                         "(no FP8 hardware)")
        notes.append("CPU: no low-precision GEMM hardware; weights stay stored in low precision and are dequantized per "
                     "forward unless a GEMM is listed below")
    engine = RealQuantEngine(model, ctx.reference.tokenizer, notes=notes, runtime=option(ctx.config.engine))
    engine.prequantize_kv()
    return engine



build_realquant.check = check  # type: ignore[attr-defined]
