"""Read a ModelOpt unified HF checkpoint back into a model that runs the way it will be served.

Weights come from the files, decoded to real numbers (`formats.py`); what a deployment does to
activations is rebuilt from the scales stored beside them: the static input scale of each
quantized layer (FP8 / INT8 activations), the SmoothQuant / AWQ `pre_quant_scale`, and the FP8
KV-cache `k_scale` / `v_scale`. Those are applied with ModelOpt's own quantizers (the same
kernels the fakequant candidate uses), so the only difference from the calibrated fake-quant
model is what the export itself changed — which is what gating an export should measure.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..config import KVCache, QuantConfig
from ..errors import ModelError
from ..model_files import check_safetensors
from ..quantize.formats import FORMATS, FormatSpec
from ..quantize.modelopt_adapter import insert_quantizers, set_quantizer
from .formats import BY_QUANT_ALGO

HF_QUANT_CONFIG = "hf_quant_config.json"


@dataclass
class UnifiedCheckpoint:
    """What a unified checkpoint folder declares about itself."""

    folder: Path
    config: dict[str, Any]
    quant_algo: str | None
    kv_cache_algo: str | None
    exclude: list[str]
    block_size: int | None = None
    quantized_layers: list[str] = field(default_factory=list)

    @property
    def format(self) -> FormatSpec | None:
        if self.quant_algo is None:
            return None
        name = BY_QUANT_ALGO.get(self.quant_algo)
        if name is None:
            raise ModelError(f"{self.folder / HF_QUANT_CONFIG}: quant_algo {self.quant_algo!r} is not one qval can read "
                             f"(readable: {', '.join(sorted(BY_QUANT_ALGO))}).")
        return FORMATS.get(name)


def read_declaration(folder: Path) -> UnifiedCheckpoint:
    folder = Path(folder)
    cfg_path = folder / "config.json"
    if not cfg_path.is_file():
        raise ModelError(f"{folder}: no config.json; give a Hugging Face model folder (for example a qval export).")
    config = json.loads(cfg_path.read_text(encoding="utf-8"))
    hq = folder / HF_QUANT_CONFIG
    if not hq.is_file():
        return UnifiedCheckpoint(folder, config, None, None, [])
    q = json.loads(hq.read_text(encoding="utf-8")).get("quantization", {})
    return UnifiedCheckpoint(folder, config, q.get("quant_algo"), q.get("kv_cache_quant_algo"),
                             list(q.get("exclude_modules") or []), q.get("group_size"))


def load_tensors(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the checkpoint's safetensors shards (subfolders, e.g. a TensorRT-LLM
    checkpoint written beside it, are not part of the HF checkpoint)."""
    from safetensors.torch import load_file

    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise ModelError(f"{folder}: no .safetensors files; qval reads safetensors checkpoints only.")
    out: dict[str, torch.Tensor] = {}
    for f in files:
        check_safetensors(f)  # a truncated shard is named, not a SafetensorError traceback
        out.update(load_file(str(f)))
    return out


def quantized_layer_names(tensors: dict[str, torch.Tensor]) -> list[str]:
    """Layers that carry a `weight_scale`: the quantized ones."""
    return sorted(k.removesuffix(".weight_scale") for k in tensors if k.endswith(".weight_scale"))


def layer_tensors(tensors: dict[str, torch.Tensor], layer: str) -> dict[str, torch.Tensor]:
    prefix = layer + "."
    return {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix) and "." not in k[len(prefix):]}


def dequantized_state(decl: UnifiedCheckpoint, tensors: dict[str, torch.Tensor], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The checkpoint as a plain state dict: quantized weights decoded, scales dropped."""
    fmt = decl.format
    layers = quantized_layer_names(tensors)
    if layers and fmt is None:
        raise ModelError(f"{decl.folder}: tensors carry weight_scale but there is no {HF_QUANT_CONFIG} saying how they are quantized.")
    state: dict[str, torch.Tensor] = {}
    scale_suffixes = (".weight_scale", ".weight_scale_2", ".input_scale", ".pre_quant_scale", ".k_scale", ".v_scale")
    for k, v in tensors.items():
        if not k.endswith(scale_suffixes):
            state[k] = v.to(dtype) if v.is_floating_point() and v.element_size() > 1 else v
    for layer in layers:
        state[f"{layer}.weight"] = fmt.export.decode(  # type: ignore[union-attr]  (read formats all export)
            layer_tensors(tensors, layer), decl.block_size).to(dtype)
    return state


def build_model(decl: UnifiedCheckpoint, state: dict[str, torch.Tensor], dtype: torch.dtype,
                trust_remote_code: bool = False) -> torch.nn.Module:
    """The architecture from config.json (without its quantization_config, which transformers
    would try to act on), filled with `state`, on the CPU."""
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg_dict = {k: v for k, v in decl.config.items() if k != "quantization_config"}
    model_type = cfg_dict.pop("model_type", None)
    if model_type is None:
        raise ModelError(f"{decl.folder}/config.json has no model_type.")
    config = AutoConfig.for_model(model_type, **cfg_dict)
    with init_empty_weights(include_buffers=False):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, trust_remote_code=trust_remote_code)
    result = model.load_state_dict(state, strict=False, assign=True)
    model.tie_weights()
    missing = [k for k in result.missing_keys if any(p.is_meta for n, p in model.named_parameters() if n == k)]
    if missing:
        raise ModelError(f"{decl.folder}: the checkpoint lacks {len(missing)} tensors the architecture needs "
                         f"(first: {', '.join(missing[:3])}).")
    if result.unexpected_keys:
        raise ModelError(f"{decl.folder}: tensors the architecture does not have: {', '.join(result.unexpected_keys[:3])} …")
    return model.eval().requires_grad_(False)


def attach_quantizers(model: torch.nn.Module, decl: UnifiedCheckpoint, tensors: dict[str, torch.Tensor]) -> dict[str, int]:
    """Put back what the deployment does to activations and the KV cache, from stored scales."""
    fmt = decl.format
    if fmt is None and decl.kv_cache_algo is None:
        return {"quantized_layers": 0, "kv_quantized_layers": 0}
    kv = KVCache.fp8 if decl.kv_cache_algo == "FP8" else KVCache.fp16
    # a KV-only checkpoint takes fp8's quantizers: only its KV quantizers are switched on below
    insert_quantizers(model, QuantConfig(format=fmt.name if fmt else "fp8", kv_cache=kv, exclude=[]))
    quantized = set(quantized_layer_names(tensors)) if fmt else set()
    counts = {"quantized_layers": 0, "kv_quantized_layers": 0}
    for name, module in model.named_modules():
        wq, iq = getattr(module, "weight_quantizer", None), getattr(module, "input_quantizer", None)
        if wq is not None:
            set_quantizer(wq, enabled=False)  # the weights are already the decoded low-precision values
            if iq is not None:
                _set_input(iq, name in quantized, layer_tensors(tensors, name), fmt)
            counts["quantized_layers"] += name in quantized
        for which in ("k", "v"):
            q = getattr(module, f"{which}_bmm_quantizer", None)
            if q is None:
                continue
            scale = tensors.get(f"{name}.{which}_proj.{which}_scale")
            if scale is not None and decl.kv_cache_algo is not None:
                set_quantizer(q, scale=scale.float().reshape(()), enabled=True)
                counts["kv_quantized_layers"] += which == "k"
            else:
                set_quantizer(q, enabled=False)
    return counts


def _set_input(iq: Any, quantized: bool, t: dict[str, torch.Tensor], fmt: FormatSpec | None) -> None:
    if not quantized:
        set_quantizer(iq, enabled=False)
        return
    if "pre_quant_scale" in t:
        set_quantizer(iq, pre_quant_scale=t["pre_quant_scale"].float())
    if fmt is not None and fmt.export.static_activations and "input_scale" in t:  # type: ignore[union-attr]
        set_quantizer(iq, scale=t["input_scale"].float().reshape(()), enabled=True)
    else:
        set_quantizer(iq, enabled=False)  # weight-only formats: activations stay in high precision (pre_quant_scale still applies)


def load_unified(folder: Path, dtype: torch.dtype, device: str, trust_remote_code: bool = False) -> tuple[torch.nn.Module, dict[str, Any]]:
    """The checkpoint as a runnable model, and facts about it for the report."""
    decl = read_declaration(folder)
    tensors = load_tensors(folder)
    model = build_model(decl, dequantized_state(decl, tensors, dtype), dtype, trust_remote_code)
    counts = attach_quantizers(model, decl, tensors)
    model.to(device)
    facts = {"quant_algo": decl.quant_algo, "kv_cache_quant_algo": decl.kv_cache_algo, **counts}
    return model, facts
