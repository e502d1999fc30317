"""Write the calibrated candidate as the checkpoint that will be deployed.

The candidate is rebuilt from the reference and the calibrate stage's saved state (never the
folded fake-quant engine: folding overwrites the weights the export must pack), then handed to
ModelOpt's `export_hf_checkpoint` (the unified HF format: quantized safetensors, config.json
with `quantization_config`, and `hf_quant_config.json`) and, on request, to
`export_tensorrt_llm_checkpoint`. Both exporters modify the model they are given, so each gets
its own copy. Everything is written into a hidden sibling folder and renamed into place at the
end, so `<run>/export/` either holds a whole export or does not exist.
"""

from __future__ import annotations

import copy
import os
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..errors import BackendUnavailable, StageError
from ..io import atomic_write_json, read_json
from ..quantize.modelopt_adapter import export_hf, quantizer_state, restore_state, trtllm_decoder_type
from ..quantize.modelopt_adapter import export_trtllm as modelopt_export_trtllm

if TYPE_CHECKING:
    from ..models import LoadedModel

EXPORT_MARKER = "qval_export.json"  # provenance and stage key, written last
TRTLLM_SUBDIR = "trtllm_checkpoint"
_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


def export_dtype(reference: "LoadedModel", requested: str) -> torch.dtype:
    """The dtype of the exported high-precision tensors and scales.

    "auto" is the dtype the reference was gated in: the export is then exactly the model the
    gates measured. On a CPU that is float32 (qval computes there in float32), and a quarter of
    this model's weights are not representable in float16, so a float16 export would quantize
    slightly different numbers than the gated model did.
    """
    if requested == "auto":
        return next(reference.model.parameters()).dtype
    return _DTYPES[requested]


def calibrated_copy(reference: "LoadedModel", calib_state: Path) -> torch.nn.Module:
    """A fresh copy of the reference with the calibrated quantizers restored (not folded)."""
    model = restore_state(copy.deepcopy(reference.model), calib_state)
    # GGUF-loaded configs carry no `architectures`; ModelOpt's exporter and every deployment
    # loader read it from config.json
    if not getattr(model.config, "architectures", None):
        model.config.architectures = [type(model).__name__]
    return model


def check_exportable(model: torch.nn.Module) -> None:
    """ModelOpt packs block-quantized weights (INT4 AWQ) only in whole blocks; a layer whose
    input width is not a multiple of the block would fail deep inside the exporter."""
    for name, module in model.named_modules():
        wq = getattr(module, "weight_quantizer", None)
        blocks = quantizer_state(wq).block_sizes if wq is not None and wq.is_enabled else None
        block = (blocks or {}).get(-1)
        width = getattr(module, "in_features", None)
        if block and width and width % block:
            divisors = [b for b in (256, 128, 64, 32, 16) if all(
                getattr(m, "in_features", b) % b == 0 for _, m in model.named_modules() if getattr(m, "weight_quantizer", None) is not None)]
            hint = f"set quant.awq_block_size to {divisors[0]}" if divisors else "pick a block size that divides every layer's input width"
            raise StageError(f"{name} has input width {width}, not a multiple of the block size {block}: ModelOpt cannot pack "
                             f"partial blocks into a checkpoint (gating with fakequant works, exporting does not); {hint}.")


def is_current(dest: Path, key: str) -> bool:
    """An export already in `dest` made from the same inputs."""
    marker = dest / EXPORT_MARKER
    try:
        return marker.is_file() and read_json(marker).get("key") == key
    except (OSError, ValueError):
        return False


def export_checkpoint(
    reference: "LoadedModel",
    calib_state: Path,
    dest: Path,
    *,
    key: str,
    dtype: torch.dtype,
    trtllm: bool = False,
    tp_size: int = 1,
    provenance: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Export into `dest` (replaced atomically); returns what was written, for the report."""
    dest = Path(dest)
    partial = dest.parent / f".{dest.name}.partial"
    if partial.exists():
        shutil.rmtree(partial)  # what an interrupted export left
    partial.mkdir(parents=True)
    t0 = time.perf_counter()
    try:
        model = calibrated_copy(reference, calib_state)
        check_exportable(model)
        export_hf(model, dtype, partial)
        del model
        reference.tokenizer.save_pretrained(partial)  # a deployable folder carries its tokenizer
        trt_info = export_trtllm(reference, calib_state, partial / TRTLLM_SUBDIR, dtype, tp_size) if trtllm else None
        files = sorted(p.name for p in partial.iterdir())
        info = {
            "key": key,
            "format": "modelopt unified HF checkpoint (export_hf_checkpoint)",
            "dtype": str(dtype).removeprefix("torch."),
            "files": files,
            "bytes": sum(p.stat().st_size for p in partial.rglob("*") if p.is_file()),
            "seconds": round(time.perf_counter() - t0, 2),
            "tensorrt_llm_checkpoint": trt_info,
            "provenance": provenance or {},
        }
        atomic_write_json(partial / EXPORT_MARKER, info)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    _replace_folder(partial, dest)
    return info


def _replace_folder(src: Path, dest: Path) -> None:
    """Move `src` onto `dest`: the old export is renamed away first, then deleted, so a crash
    between the two renames leaves either the old or the new export, never a mix."""
    old = dest.parent / f".{dest.name}.old"
    if old.exists():
        shutil.rmtree(old)
    if dest.exists():
        os.replace(dest, old)
    os.replace(src, dest)
    shutil.rmtree(old, ignore_errors=True)


def export_trtllm(reference: "LoadedModel", calib_state: Path, folder: Path, dtype: torch.dtype, tp_size: int) -> dict[str, Any]:
    """ModelOpt's TensorRT-LLM checkpoint (config.json + rank<i>.safetensors per tensor-parallel rank)."""
    model = calibrated_copy(reference, calib_state)
    decoder = trtllm_decoder_type(model)
    if decoder is None:
        raise BackendUnavailable(f"ModelOpt cannot export {type(model).__name__} to a TensorRT-LLM checkpoint "
                                 f"(no decoder type for it); use the unified HF export only (engine.options.trtllm_checkpoint: false).")
    export_dtype_ = torch.float16 if dtype == torch.float32 else dtype  # TensorRT-LLM engines do not run in float32
    try:
        modelopt_export_trtllm(model, decoder, export_dtype_, folder, tp_size)
    except Exception as err:  # ModelOpt raises many kinds for unsupported layers
        raise StageError(f"ModelOpt's TensorRT-LLM checkpoint export failed for {type(model).__name__}: "
                         f"{type(err).__name__}: {err}") from None
    return {"folder": folder.name, "decoder_type": decoder, "dtype": str(export_dtype_).removeprefix("torch."),
            "tp_size": tp_size, "files": sorted(p.name for p in folder.iterdir())}
