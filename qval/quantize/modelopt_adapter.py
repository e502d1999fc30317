"""The one place qval talks to ModelOpt: no other module under qval/ imports it.

It turns qval's typed `QuantConfig` into a ModelOpt config (the format's preset, the exclude
globs, the KV-cache decision), runs `mtq.quantize` with a forward loop over the calibration
batches, and saves / restores the calibrated state so nothing is ever calibrated twice. The
engines' and the exporter's ModelOpt steps (fold, compress, export) are here too, and a
quantizer's state is read through `quantizer_state` and written through `set_quantizer`:
ModelOpt's private attribute names appear in this module only, pinned by
tests/quantize/test_modelopt_boundary.py.

The KV-cache decision is explicit both ways: `kv_cache: fp16` *disables* `*[kv]_bmm_quantizer`
rather than relying on the preset to leave it off, because ModelOpt's own examples turn an FP8
KV cache on by default and a gate that silently tested FP8 KV would approve the wrong thing.
"""

from __future__ import annotations

import contextlib
import copy
import io
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

import torch

from ..config import KVCache, QuantConfig
from ..errors import BackendUnavailable, StageError
from ..io import atomic_write
from .formats import names_where

KV_QUANTIZERS = "*[kv]_bmm_quantizer"


def build_mtq_config(q: QuantConfig, alpha: float | None = None) -> dict[str, Any]:
    """qval's quant section -> the dict `mtq.quantize` takes.

    >>> cfg = build_mtq_config(QuantConfig(format="fp8", kv_cache="fp16", exclude=["*lm_head*"]))
    >>> cfg["quant_cfg"][-1]
    {'quantizer_name': '*[kv]_bmm_quantizer', 'enable': False}
    """
    spec = q.spec
    cfg = copy.deepcopy(spec.adjust(preset(spec.preset) if spec.preset else None, q, alpha))
    entries: list[dict[str, Any]] = list(cfg["quant_cfg"])
    for pattern in q.exclude:
        # a glob may name a module ("*mlp.down_proj") or a quantizer; cover both
        entries.append({"quantizer_name": pattern, "enable": False})
        entries.append({"quantizer_name": f"{pattern}.*", "enable": False})
    if spec.kv_cache and q.kv_cache is KVCache.fp8:
        entries.append({"quantizer_name": KV_QUANTIZERS, "cfg": {"num_bits": (4, 3), "axis": None}})
        if q.kv_only:  # nothing else to calibrate: the K/V amax by max, as ModelOpt's presets do
            cfg["algorithm"] = "max"
    else:
        entries.append({"quantizer_name": KV_QUANTIZERS, "enable": False})
    cfg["quant_cfg"] = entries
    return cfg


def preset(name: str) -> dict[str, Any]:
    """A copy of one of ModelOpt's preset configs (`mtq.FP8_DEFAULT_CFG`, …)."""
    import modelopt.torch.quantization as mtq

    return copy.deepcopy(getattr(mtq, name))


def check_supported(q: QuantConfig, device: str) -> None:
    if q.spec.needs_cuda and device != "cuda":
        cpu = names_where(lambda s: s.quantizes and not s.needs_cuda)
        raise BackendUnavailable(
            f"quant.format {q.format.value} needs a CUDA GPU (ModelOpt's {q.format.value} kernels have no CPU path); "
            f"this run's device is {device}. Run it on a GPU machine, or pick {', '.join(cpu[:-1])} or {cpu[-1]}."
        )


def make_forward_loop(
    batches: list[torch.Tensor], device: str, on_batch: Callable[[int], None] | None = None
) -> Callable[[torch.nn.Module], None]:
    """The loop ModelOpt calls (once per calibration pass) to show the model its data."""

    def forward_loop(model: torch.nn.Module) -> None:
        with torch.no_grad():
            for i, batch in enumerate(batches):
                model(input_ids=batch.to(device), use_cache=False)
                if on_batch is not None:
                    on_batch(i)

    return forward_loop


@contextlib.contextmanager
def _quiet() -> Iterable[None]:
    """ModelOpt prints per-module lines to stdout; keep them out of the user's terminal."""
    with contextlib.redirect_stdout(io.StringIO()):
        yield


def quantize(
    model: torch.nn.Module,
    q: QuantConfig,
    batches: list[torch.Tensor],
    device: str,
    alpha: float | None = None,
    on_batch: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """Calibrate `model` in place; returns facts about the calibration for the report."""
    import modelopt.torch.quantization as mtq

    check_supported(q, device)
    cfg = build_mtq_config(q, alpha)
    t0 = time.perf_counter()
    if not q.has_quantizers:
        return {"seconds": 0.0, "quantizers_enabled": 0, "mtq_config": cfg}
    with _quiet():
        mtq.quantize(model, cfg, forward_loop=make_forward_loop(batches, device, on_batch))
    return {
        "seconds": round(time.perf_counter() - t0, 2),
        "quantizers_enabled": sum(1 for _, m in iter_quantizers(model) if m.is_enabled),
        "mtq_config": cfg,
    }


def iter_quantizers(model: torch.nn.Module) -> Iterable[tuple[str, Any]]:
    from modelopt.torch.quantization.nn import TensorQuantizer

    for name, module in model.named_modules():
        if isinstance(module, TensorQuantizer):
            yield name, module


def _torch_save(blob: Any, path: Path) -> None:
    """torch.save through an open file: the archive's records are then named "archive/…" rather
    than after atomic_write's temporary file, so the same state is the same bytes in every run."""
    with open(path, "wb") as f:
        torch.save(blob, f)


def save_state(model: torch.nn.Module, reference_state: dict[str, Any], path: Path) -> dict[str, Any]:
    """Save what calibration produced: the ModelOpt state, every quantizer buffer, and the
    weights calibration changed (SmoothQuant and AWQ fold scales into weights), not the
    untouched rest of the model, which the reference already holds. `reference_state`: the
    reference's tensors, or their `qval.checksum.checksums` (a model calibrated in place)."""
    import modelopt.torch.opt as mto

    from ..checksum import checksum

    def same(k: str, v: torch.Tensor) -> bool:
        r = reference_state[k]
        return torch.equal(v, r) if isinstance(r, torch.Tensor) else checksum(v) == r

    state = model.state_dict()
    changed = {
        k: v.detach().cpu()
        for k, v in state.items()
        if "quantizer" in k or k not in reference_state or not same(k, v)
    }
    blob = {"modelopt_state": mto.modelopt_state(model), "tensors": changed}
    needed = sum(v.numel() * v.element_size() for v in changed.values())  # at least: the tensors, for a disk-full message
    atomic_write(path, lambda p: _torch_save(blob, p), needed=needed)
    return {"tensors_saved": len(changed), "weights_changed": sum(1 for k in changed if "quantizer" not in k)}


def restore_state(model: torch.nn.Module, path: Path) -> torch.nn.Module:
    """Re-create a calibrated candidate from the reference weights and a saved state."""
    import modelopt.torch.opt as mto

    try:
        blob = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as err:
        raise StageError(f"{path}: the saved calibration cannot be read ({err}); delete it and calibrate again.") from None
    with _quiet():
        model = mto.restore_from_modelopt_state(model, blob["modelopt_state"])
    device = next(model.parameters()).device
    missing = model.load_state_dict({k: v.to(device) for k, v in blob["tensors"].items()}, strict=False)
    if missing.unexpected_keys:
        raise StageError(f"{path}: the saved calibration does not fit this model ({missing.unexpected_keys[:3]} …).")
    return model


def insert_quantizers(model: torch.nn.Module, q: QuantConfig) -> None:
    """Put `q`'s quantizers into `model` without calibrating them (their scales are set afterwards)."""
    import modelopt.torch.quantization as mtq

    cfg = build_mtq_config(q)
    cfg["algorithm"] = None  # nothing is calibrated here
    with _quiet():
        mtq.quantize(model, cfg, forward_loop=None)


def fold_weights(model: torch.nn.Module) -> None:
    """Quantize every weight once, in place, and switch its quantizer off (`mtq.fold_weight`)."""
    import modelopt.torch.quantization as mtq

    with _quiet():
        mtq.fold_weight(model)


def compress(model: torch.nn.Module) -> None:
    """Real low-precision weights (`mtq.compress`) and ModelOpt's real-quant GEMMs where it has one.
    Its FP8 per-tensor GEMM registers itself on import, which ModelOpt 0.47 never does."""
    import modelopt.torch.quantization as mtq
    import modelopt.torch.quantization.backends.fp8_per_tensor_gemm  # noqa: F401
    from modelopt.torch.quantization.backends.gemm_registry import enable_real_quant_gemm

    with _quiet():
        mtq.compress(model)
    enable_real_quant_gemm(model)


def real_quant_weight(module: torch.nn.Module) -> tuple[torch.Tensor, str] | None:
    """(stored codes, 'fp8' or 'other') of a compressed linear's weight; None for any other module."""
    from modelopt.torch.quantization.nn.modules.quant_linear import RealQuantLinear
    from modelopt.torch.quantization.qtensor import FP8QTensor, QTensorWrapper

    w = getattr(module, "weight", None)
    if not isinstance(module, RealQuantLinear) or not isinstance(w, QTensorWrapper):
        return None
    qt = w.get_qtensor()
    return qt._quantized_data, "fp8" if isinstance(qt, FP8QTensor) else "other"


def as_exported(model: torch.nn.Module) -> torch.nn.Module:
    """Apply, in place, the step ModelOpt's exporter applies before packing (shared-input layers
    get one pre_quant_scale and one input amax; their weights are re-quantized)."""
    from modelopt.torch.export.unified_export_hf import requantize_resmooth_fused_llm_layers

    with _quiet(), torch.no_grad():
        requantize_resmooth_fused_llm_layers(model)
    return model


def export_hf(model: torch.nn.Module, dtype: torch.dtype, folder: Path) -> None:
    """ModelOpt's unified Hugging Face checkpoint of a calibrated model."""
    from modelopt.torch.export import export_hf_checkpoint

    with _quiet():
        export_hf_checkpoint(model, dtype=dtype, export_dir=folder)


def trtllm_decoder_type(model: torch.nn.Module) -> str | None:
    """ModelOpt's TensorRT-LLM decoder type of the model (None: it cannot export it)."""
    from modelopt.torch.export.model_utils import get_model_type

    return get_model_type(model)


def export_trtllm(model: torch.nn.Module, decoder: str, dtype: torch.dtype, folder: Path, tp_size: int) -> None:
    """ModelOpt's TensorRT-LLM checkpoint (config.json + rank<i>.safetensors per tensor-parallel rank)."""
    from modelopt.torch.export import export_tensorrt_llm_checkpoint

    with _quiet():
        export_tensorrt_llm_checkpoint(model, decoder, dtype=dtype, export_dir=folder, inference_tensor_parallel=tp_size)


@dataclass(frozen=True)
class QuantizerState:
    """What qval reads of one ModelOpt `TensorQuantizer`, taken once (`quantizer_state`)."""

    enabled: bool
    num_bits: Any  # an int, or (exponent, mantissa) bits of a float format
    unsigned: bool
    axis: Any
    block_sizes: dict | None
    amax: torch.Tensor | None  # the calibrated range; None when there is none (dynamic, MX) or not yet
    maxbound: float | None  # the largest code; None for grids without one
    pre_quant_scale: torch.Tensor | None  # the SmoothQuant / AWQ scale applied to the input
    stored_pre_quant_scale: torch.Tensor | None  # the same buffer, whether or not it is applied
    scale: torch.Tensor | None  # a compressed weight's stored scale (after `compress`)
    fake_quant: bool
    if_quant: bool
    if_calib: bool
    rotate: bool
    use_constant_amax: bool
    dynamic: bool
    backend: Any  # a registered quantization backend's name, or None for ModelOpt's own
    bias_calibration: bool


def quantizer_state(q: Any) -> QuantizerState:
    """The quantizer's state. ModelOpt's private names are read here only; a ModelOpt upgrade that
    renames one fails tests/quantize/test_modelopt_boundary.py, which names it."""
    dynamic = bool(getattr(q, "_dynamic", False))
    try:
        maxbound: float | None = float(q.maxbound)
    except (TypeError, ValueError, AttributeError):  # grids without a single largest value (e.g. MX)
        maxbound = None
    return QuantizerState(
        enabled=q.is_enabled, num_bits=q._num_bits, unsigned=bool(q._unsigned), axis=q._axis, block_sizes=q._block_sizes,
        amax=None if dynamic else q.amax, maxbound=maxbound, pre_quant_scale=q.pre_quant_scale,
        stored_pre_quant_scale=getattr(q, "_pre_quant_scale", None), scale=getattr(q, "_scale", None),
        fake_quant=bool(q._fake_quant), if_quant=bool(q._if_quant), if_calib=bool(q._if_calib), rotate=bool(q.rotate_is_enabled),
        use_constant_amax=bool(getattr(q, "_use_constant_amax", False)), dynamic=dynamic,
        backend=getattr(q, "backend", None), bias_calibration=q.bias_calibrator is not None,
    )


def set_quantizer(q: Any, *, enabled: bool | None = None, amax: torch.Tensor | None = None,
                  scale: torch.Tensor | None = None, pre_quant_scale: torch.Tensor | None = None) -> None:
    """Write a quantizer's state: its range as `amax`, or as a stored `scale` (amax = scale × maxbound,
    as ModelOpt's exporter stores it), its SmoothQuant / AWQ input scale, and on or off."""
    if pre_quant_scale is not None:
        q.pre_quant_scale = pre_quant_scale
    if scale is not None:
        amax = scale * q.maxbound
    if amax is not None:
        q.amax = amax
    if enabled is not None:
        q.enable() if enabled else q.disable()
