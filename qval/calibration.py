"""The calibration windows: from the dataset and the tokenizer alone (`qval validate` counts
them), and as batches for a run (the config and the loaded reference, whose tokenizer makes them); the
calibrate and diagnose stages read the same batches.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any

import torch

from .config import GateConfig
from .data import chunk, read_texts, token_stream
from .errors import DataError
from .shortfall import shortfall

if TYPE_CHECKING:
    from .models import LoadedModel


def select_windows(available: int, samples: int, sample_seed: int | None) -> list[int]:
    """Which of the dataset's `available` windows calibrate: the first `samples` in order (no seed,
    the default), or the `samples` windows that rank first by sha256 of "seed:index" (a draw without
    replacement that any Python or machine repeats), in dataset order. A calibration on another
    sample is a healthy variant of the same configuration (benchmarks/error_rates.py).

    >>> select_windows(10, 4, None)
    [0, 1, 2, 3]
    >>> select_windows(10, 4, 1), select_windows(10, 4, 2), select_windows(3, 4, 1)
    ([4, 6, 7, 8], [1, 2, 5, 6], [0, 1, 2])
    """
    n = min(samples, available)
    if sample_seed is None:
        return list(range(n))
    return sorted(sorted(range(available), key=lambda i: hashlib.sha256(f"{sample_seed}:{i}".encode()).digest())[:n])


def calibration_samples(cfg: GateConfig, tokenizer: Any) -> tuple[list[list[int]], dict[str, Any]]:
    """The calibration windows from the dataset and the tokenizer alone (qval validate runs it too)."""
    c = cfg.calibration
    ids = token_stream(read_texts(c.dataset, cfg.resolve(c.dataset)), tokenizer, tokenizer.eos_token_id)
    windows = chunk(ids, c.seq_len, limit=c.samples if c.sample_seed is None else None)
    picked = select_windows(len(windows), c.samples, c.sample_seed)
    samples = [windows[i] for i in picked]
    if not samples:
        raise DataError(f"{c.dataset}: {len(ids)} tokens is less than one sample of seq_len={c.seq_len}.")
    info = {"dataset": c.dataset, "samples_requested": c.samples, "samples_used": len(samples), "seq_len": c.seq_len,
            "dataset_tokens": len(ids), "sample_seed": c.sample_seed}
    if c.sample_seed is not None:
        info.update(windows_available=len(windows), windows=picked)
    if note := shortfall("calibration.samples", c.samples, len(samples), f"samples of {c.seq_len} tokens", cfg.max_shortfall):
        info["shortfall"] = note
    return samples, info


def calibration_batches(cfg: GateConfig, reference: LoadedModel, batch_size: int | None = None,
                        ) -> tuple[list[torch.Tensor], dict[str, Any]]:
    """`cfg`'s calibration samples, tokenized by the reference, in batches: of `batch_size` (the size a
    finished calibration recorded), else of the config's, `auto` deciding from the free memory now."""
    c = cfg.calibration
    samples, info = calibration_samples(cfg, reference.tokenizer)
    bs = batch_size or (auto_batch_size(cfg, reference) if c.batch_size == "auto" else c.batch_size)
    batches = [torch.tensor(samples[i : i + bs]) for i in range(0, len(samples), bs)]
    return batches, {**info, "batch_size": bs}


def auto_batch_size(cfg: GateConfig, reference: LoadedModel) -> int:
    """4 on CPU (more does not speed up 2 cores); on a GPU as many samples as fit in a quarter
    of free memory, counting the float32 logits, which dominate for large vocabularies."""
    if reference.device != "cuda":
        return 4
    free, _ = torch.cuda.mem_get_info()
    vocab = reference.model.config.vocab_size
    per_sample = cfg.calibration.seq_len * vocab * 4 * 3
    return int(max(1, min(32, free // 4 // per_sample)))


def expand_alphas(cfg: GateConfig) -> list[tuple[GateConfig, float | None]]:
    """A list of SmoothQuant alphas is a sweep: one candidate per alpha, named after it."""
    q = cfg.quant
    if not q.spec.takes_smoothquant_alpha:
        return [(cfg, None)]
    if not isinstance(q.smoothquant_alpha, list):
        return [(cfg, q.alphas[0])]
    out = []
    for a in q.smoothquant_alpha:
        c = cfg.model_copy(update={"name": f"{cfg.name}-alpha{a:g}", "quant": q.model_copy(update={"smoothquant_alpha": a})})
        out.append((c, a))
    return out
