"""The models the benchmark runs: random-weight Llama layouts of real size, and the built-in model.

Random weights are enough for speed: every forward, every decode step and calibration cost
the same whatever the values are. They are drawn (seed 0) by transformers' own initialiser,
never zeros (a GPU can run zeros faster than real data). Gate figures computed on them mean
nothing and the benchmark never reports them as quality.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from qval.io import hash_json
from qval.models import LoadedModel

# Public layouts: Llama-3.2-1B and Llama-3.1-8B (config.json of each), rope scaling left out
# (it changes no shape). `smoke` is a toy for running the whole script on a CPU in seconds;
# its vocabulary is the built-in tokenizer's, so every id the tokenizer emits is valid.
SHAPES: dict[str, dict[str, Any]] = {
    "1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
               num_key_value_heads=8, head_dim=64, vocab_size=128256, tie_word_embeddings=True,
               max_position_embeddings=131072, rope_theta=500000.0, rms_norm_eps=1e-5),
    "8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
               num_key_value_heads=8, head_dim=128, vocab_size=128256, tie_word_embeddings=False,
               max_position_embeddings=131072, rope_theta=500000.0, rms_norm_eps=1e-5),
    # ~57B: Llama-3.1-70B's layer with 64 of its 80 layers. Its bf16 weights (114 GB) fit an H200
    # (141 GB) once, not twice: the shape of issue 14's sequential run (reference and candidate apart)
    "57b": dict(hidden_size=8192, intermediate_size=28672, num_hidden_layers=64, num_attention_heads=64,
                num_key_value_heads=8, head_dim=128, vocab_size=128256, tie_word_embeddings=False,
                max_position_embeddings=131072, rope_theta=500000.0, rms_norm_eps=1e-5),
    "smoke": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, vocab_size=49152, tie_word_embeddings=True,
                  max_position_embeddings=8192),
}


def weight_bytes_per_step(model: torch.nn.Module) -> int:
    """Bytes of weights one decode step must read: every parameter once, except an untied
    input embedding, of which a step reads only the rows of its tokens.

    >>> import torch.nn as nn
    >>> m = nn.Module(); m.lin = nn.Linear(4, 4, bias=False)
    >>> weight_bytes_per_step(m)
    64
    """
    embed = getattr(model, "get_input_embeddings", lambda: None)()
    head = getattr(model, "get_output_embeddings", lambda: None)()
    skip = set()
    if embed is not None and (head is None or head.weight is not embed.weight):
        skip.add(id(embed.weight))
    return sum(p.numel() * p.element_size() for p in model.parameters() if id(p) not in skip)


def random_llama(shape: str, tokenizer: Any, device: str, dtype: torch.dtype, folder: Path) -> LoadedModel:
    """A Llama of the named layout with random weights, as qval's loader would return it.

    `folder` receives the config and tokenizer files (no weights): a `model: {source: path}`
    config pointing there gets a stable fingerprint without a 16 GB checkpoint on disk.
    """
    from transformers import AutoModelForCausalLM, LlamaConfig

    t0 = time.perf_counter()
    cfg = LlamaConfig(**SHAPES[shape], bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                      pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    model.eval().requires_grad_(False)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    folder.mkdir(parents=True, exist_ok=True)
    model.config.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return LoadedModel(
        model=model, tokenizer=tokenizer, name=f"random Llama layout {shape}",
        fingerprint=hash_json({"shape": SHAPES[shape], "seed": 0, "dtype": str(dtype)}), device=device,
        requested_dtype=str(dtype).removeprefix("torch."), compute_dtype=str(dtype).removeprefix("torch."),
        notes=["random weights (seed 0): for timing only; gate figures on it mean nothing"],
        load_seconds=time.perf_counter() - t0,
    )


def parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
