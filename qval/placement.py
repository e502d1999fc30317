"""Where the reference goes when it does not fit one GPU (`model.placement`).

`plan` decides from the model's size and each device's free memory, before anything loads:
one GPU when the model fits it; else spread over every visible GPU with accelerate's
`device_map="auto"` (each GPU given its free memory less `HEADROOM` for activations, logits and
the KV cache); else the same with CPU memory as the last resort (offloaded layers move over PCIe
at every forward: many times slower, said in the report's notes); else a clear error.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import ModelError

HEADROOM = 0.2  # of each device's free memory left for what a forward allocates beside the weights
GB = 1e9


@dataclass(frozen=True)
class Placement:
    device_map: str | None = None  # None: the whole model on one device; "auto": accelerate spreads it
    max_memory: dict[Any, int] | None = None  # per GPU index (and "cpu"), the budget accelerate may fill
    note: str | None = None

    def load_kwargs(self) -> dict[str, Any]:
        return {"device_map": self.device_map, "max_memory": self.max_memory} if self.device_map else {}


def plan(model_bytes: int | None, gpu_free: list[int], cpu_free: int | None, mode: str = "auto") -> Placement:
    """The placement of a model of `model_bytes` (None: unknown), given each visible GPU's free
    bytes and the host's. `mode`: auto (one GPU if it fits, else spread, else offload), single
    (always one GPU), spread (every visible GPU even when one would do).

    >>> plan(10 * 2**30, [80 * 2**30], None)
    Placement(device_map=None, max_memory=None, note=None)
    >>> p = plan(100 * 2**30, [80 * 2**30, 80 * 2**30], None)
    >>> p.device_map, sorted(p.max_memory), p.note.split(":")[0]
    ('auto', [0, 1], 'spread over 2 GPUs')
    >>> plan(200 * 2**30, [80 * 2**30, 80 * 2**30], 400 * 2**30).note.split(":")[0]
    'CPU offload'
    """
    if not gpu_free or mode == "single" or model_bytes is None and mode != "spread":
        return Placement()
    budgets = {i: int(free * (1 - HEADROOM)) for i, free in enumerate(gpu_free)}
    if mode == "auto" and model_bytes is not None and model_bytes <= budgets[0]:
        return Placement()
    if len(gpu_free) > 1 and (model_bytes is None or model_bytes <= sum(budgets.values())):
        each = ", ".join(f"{b / GB:.0f}" for b in budgets.values())
        size = f"{model_bytes / GB:.1f} GB of weights" if model_bytes is not None else "the weights"
        return Placement("auto", budgets, f"spread over {len(gpu_free)} GPUs: {size} with at most {each} GB on each "
                                          "(accelerate device_map='auto')")
    if model_bytes is None:
        return Placement()
    cpu_budget = int((cpu_free or 0) * (1 - HEADROOM))
    if model_bytes <= sum(budgets.values()) + cpu_budget:
        return Placement("auto", {**budgets, "cpu": cpu_budget},
                         f"CPU offload: {model_bytes / GB:.1f} GB of weights do not fit the GPUs' "
                         f"{sum(budgets.values()) / GB:.0f} GB; the rest lives in host memory and crosses PCIe at every "
                         "forward, many times slower than on the GPUs")
    raise ModelError(f"the model's {model_bytes / GB:.1f} GB of weights fit neither the GPUs ({sum(budgets.values()) / GB:.0f} GB "
                     f"usable of {len(gpu_free)}) nor with the host's memory ({cpu_budget / GB:.0f} GB usable); use a machine "
                     "with more GPU memory or a smaller dtype.")


def checkpoint_bytes(target: Any, kwargs: dict[str, Any], element_size: int) -> int | None:
    """The weights' size in the compute dtype, from a local folder's safetensors files (stored at
    16 bits: the usual checkpoint); None when it cannot be told without loading (a hub id, a GGUF)."""
    folder = Path(str(target))
    if "gguf_file" in kwargs or not folder.is_dir():
        return None
    stored = sum(p.stat().st_size for p in folder.glob("*.safetensors"))
    return int(stored * element_size / 2) if stored else None


def visible_memory() -> tuple[list[int], int | None]:
    """Free bytes of each visible GPU, and the host's available memory (Linux /proc/meminfo)."""
    import torch

    gpus = [torch.cuda.mem_get_info(i)[0] for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f if ":" in line}
        return gpus, info.get("MemAvailable")
    except (OSError, ValueError, IndexError):
        return gpus, None
