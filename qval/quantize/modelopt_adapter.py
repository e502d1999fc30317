"""The one place qval talks to ModelOpt's quantization API.

It turns qval's typed `QuantConfig` into a ModelOpt config (the format's preset, the exclude
globs, the KV-cache decision), runs `mtq.quantize` with a forward loop over the calibration
batches, and saves / restores the calibrated state so nothing is ever calibrated twice.

The KV-cache decision is explicit both ways: `kv_cache: fp16` *disables* `*[kv]_bmm_quantizer`
rather than relying on the preset to leave it off, because ModelOpt's own examples turn an FP8
KV cache on by default and a gate that silently tested FP8 KV would approve the wrong thing.
"""

from __future__ import annotations

import contextlib
import copy
import io
import time
from pathlib import Path
from typing import Any, Callable, Iterable

import torch

from ..config import KVCache, QuantConfig, QuantFormat
from ..errors import BackendUnavailable, StageError
from ..io import atomic_write
from .formats import FORMATS

KV_QUANTIZERS = "*[kv]_bmm_quantizer"


def build_mtq_config(q: QuantConfig, alpha: float | None = None) -> dict[str, Any]:
    """qval's quant section -> the dict `mtq.quantize` takes.

    >>> cfg = build_mtq_config(QuantConfig(format="fp8", kv_cache="fp16", exclude=["*lm_head*"]))
    >>> cfg["quant_cfg"][-1]
    {'quantizer_name': '*[kv]_bmm_quantizer', 'enable': False}
    """
    spec = FORMATS.get(q.format.value)
    cfg = copy.deepcopy(spec.make(q, alpha))
    entries: list[dict[str, Any]] = list(cfg["quant_cfg"])
    for pattern in q.exclude:
        # a glob may name a module ("*mlp.down_proj") or a quantizer; cover both
        entries.append({"quantizer_name": pattern, "enable": False})
        entries.append({"quantizer_name": f"{pattern}.*", "enable": False})
    if q.format is not QuantFormat.none and q.kv_cache is KVCache.fp8:
        entries.append({"quantizer_name": KV_QUANTIZERS, "cfg": {"num_bits": (4, 3), "axis": None}})
    else:
        entries.append({"quantizer_name": KV_QUANTIZERS, "enable": False})
    cfg["quant_cfg"] = entries
    return cfg


def check_supported(q: QuantConfig, device: str) -> None:
    spec = FORMATS.get(q.format.value)
    if spec.needs_cuda and device != "cuda":
        raise BackendUnavailable(
            f"quant.format {q.format.value} needs a CUDA GPU (ModelOpt's {q.format.value} kernels have no CPU path); "
            f"this run's device is {device}. Run it on a GPU machine, or pick fp8, int8_sq, int4_awq or w4a8_awq."
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
    if q.format is QuantFormat.none:
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


def save_state(model: torch.nn.Module, reference_state: dict[str, torch.Tensor], path: Path) -> dict[str, Any]:
    """Save what calibration produced: the ModelOpt state, every quantizer buffer, and the
    weights calibration changed (SmoothQuant and AWQ fold scales into weights), not the
    untouched rest of the model, which the reference already holds."""
    import modelopt.torch.opt as mto

    state = model.state_dict()
    changed = {
        k: v.detach().cpu()
        for k, v in state.items()
        if "quantizer" in k or k not in reference_state or not torch.equal(v, reference_state[k])
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
