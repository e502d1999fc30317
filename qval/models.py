"""Load the reference model and tokenizer, and say exactly what was loaded.

Where the model is comes from qval/model_location.py, the device and dtype it computes in from
qval/devices.py (both looked up at call time: tests replace `model_location.locate` and
`devices.pick_device`). transformers dequantizes GGUF tensors to float, so a GGUF reference is that
dequantized checkpoint, not the original FP16 one.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch

from . import determinism, devices, model_location
from .config import ModelConfig
from .errors import ConfigError, ModelError
from .placement import Placement, checkpoint_bytes, plan, visible_memory


@dataclass
class LoadedModel:
    """A model ready to run, with the facts a report needs about it."""

    model: torch.nn.Module
    tokenizer: Any
    name: str
    fingerprint: str
    device: str
    requested_dtype: str
    compute_dtype: str
    notes: list[str] = field(default_factory=list)
    load_seconds: float = 0.0

    @property
    def vocab(self) -> int:
        """Rows of its output layer: the token ids its logits cover (a served reference's `vocab` likewise)."""
        return int(self.model.get_output_embeddings().weight.shape[0])

    @property
    def eos(self) -> list[int]:
        """The ids that end its generations: the generation config's, else the tokenizer's."""
        eos = getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
        if eos is None:
            eos = getattr(self.tokenizer, "eos_token_id", None)
        return [int(i) for i in (eos if isinstance(eos, list) else [eos]) if i is not None]

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "fingerprint": self.fingerprint,
            "device": self.device,
            "requested_dtype": self.requested_dtype,
            "compute_dtype": self.compute_dtype,
            "parameters": sum(p.numel() for p in self.model.parameters()),
            "notes": self.notes,
            "load_seconds": round(self.load_seconds, 2),
        }


def load_tokenizer(cfg: ModelConfig, run_code: bool = True) -> Any:
    """The reference's tokenizer; `run_code` False: never the model's own code, whatever
    trust_remote_code says (the preflight's: transformers' own tokenizer classes only)."""
    from transformers import AutoTokenizer

    target, kwargs, _, _ = model_location.locate(cfg)
    if cfg.tokenizer:
        target, kwargs = cfg.tokenizer, {}
    try:
        tok = AutoTokenizer.from_pretrained(target, trust_remote_code=cfg.trust_remote_code and run_code, **kwargs)
    except (OSError, ValueError) as err:
        raise ModelError(f"cannot load the tokenizer from {target}: {err}") from None
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


@contextlib.contextmanager
def _no_progress_bar() -> Iterator[None]:
    """transformers' progress bars off for the call, and back as they were after it."""
    from transformers.utils import logging as hf_logging

    was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_on:
            hf_logging.enable_progress_bar()


def load_model(cfg: ModelConfig) -> LoadedModel:
    """Load the reference in eval mode on its device, in the dtype it will compute in."""
    from transformers import AutoModelForCausalLM

    if cfg.source == "served":
        raise ConfigError("model.source is served: the reference's weights are on its server, not here; this command needs "
                          "them in memory (qval gate reaches a served reference through its engine)")
    t0 = time.perf_counter()
    target, kwargs, name, fingerprint = model_location.locate(cfg)
    device = devices.pick_device(cfg.device)
    determinism.configure(device)  # before the model reaches the GPU: fixed numerics, reproducible figures
    dtype, notes = devices.compute_dtype_for(cfg.dtype, device)
    if "gguf_file" in kwargs:
        notes.append("GGUF weights dequantized to float by transformers: this reference is the dequantized checkpoint")
    where = Placement()
    if device.startswith("cuda"):  # beyond one GPU: spread over every visible one (qval/placement.py)
        gpus, host = visible_memory()
        where = plan(checkpoint_bytes(target, kwargs, torch.empty(0, dtype=dtype).element_size()), gpus, host, cfg.placement)
        if where.note:
            notes.append(where.note)
    try:
        with _no_progress_bar():  # the GGUF dequantization bar; qval reports the load time
            model = AutoModelForCausalLM.from_pretrained(
                target, dtype=dtype, trust_remote_code=cfg.trust_remote_code, low_cpu_mem_usage=True, **kwargs,
                **where.load_kwargs()
            )
    except (OSError, ValueError, ImportError) as err:
        hint = " trust_remote_code is off; turn it on in model: only for code you trust." if "trust_remote_code" in str(err) else ""
        raise ModelError(f"cannot load model {name!r} from {target}: {err}.{hint}") from None
    if where.device_map is None:
        model.to(device)
    model.eval()
    model.requires_grad_(False)
    tokenizer = load_tokenizer(cfg)
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        name=name,
        fingerprint=fingerprint,
        device=device,
        requested_dtype=cfg.dtype,
        compute_dtype=str(dtype).removeprefix("torch."),
        notes=notes,
        load_seconds=time.perf_counter() - t0,
    )


def meta_model(cfg: ModelConfig) -> torch.nn.Module:
    """The model's modules without weights (PyTorch's meta device): its shapes and config, for a
    memory footprint, without loading it (a parallel sweep's parent leaves the GPUs to its workers)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    target, kwargs, name, _ = model_location.locate(cfg)
    try:
        config = AutoConfig.from_pretrained(target, trust_remote_code=cfg.trust_remote_code, **kwargs)
        with torch.device("meta"):
            return AutoModelForCausalLM.from_config(config, trust_remote_code=cfg.trust_remote_code)
    except (OSError, ValueError) as err:
        raise ModelError(f"cannot read the configuration of model {name!r} from {target}: {err}.") from None
