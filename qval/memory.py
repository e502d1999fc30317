"""Peak memory of one phase of a run (a stage: calibrate, build, a gate): the process's resident
memory sampled every few milliseconds (ru_maxrss only ever grows, so it cannot tell phases
apart), and on CUDA the allocator's peak, reset at the phase's start.

    with PhaseMemory() as mem:
        ...
    mem.describe()  # {"peak_rss_bytes": …, "peak_cuda_bytes": … (CUDA only)}
"""

from __future__ import annotations

import os
import threading
from typing import Any

import torch

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def rss_bytes() -> int | None:
    """This process's resident set size now (Linux /proc), or None where it cannot be read."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


class PhaseMemory:
    def __init__(self, every_s: float = 0.01) -> None:
        self.every_s = every_s
        self.peak_rss: int | None = None
        self.peak_cuda: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _sample(self) -> None:
        r = rss_bytes()
        if r is not None and (self.peak_rss is None or r > self.peak_rss):
            self.peak_rss = r

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            self._sample()

    def __enter__(self) -> "PhaseMemory":
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            for d in range(torch.cuda.device_count()):
                torch.cuda.reset_peak_memory_stats(d)
        self._sample()
        self._thread = threading.Thread(target=self._loop, name="qval-memory", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._sample()
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            self.peak_cuda = int(max(torch.cuda.max_memory_allocated(d) for d in range(torch.cuda.device_count())))

    def describe(self) -> dict[str, int]:
        out = {}
        if self.peak_rss is not None:
            out["peak_rss_bytes"] = self.peak_rss
        if self.peak_cuda is not None:
            out["peak_cuda_bytes"] = self.peak_cuda
        return out


def free_memory() -> None:
    """Give back what released models held: Python's references, then the CUDA allocator's cache."""
    import gc

    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def empty_tensors(model: torch.nn.Module) -> None:
    """Every parameter and buffer of `model` emptied in place: its memory is given back even while
    something still refers to the module (a captured graph, a cycle). The model is unusable after."""
    for t in [*model.parameters(), *model.buffers()]:
        t.data = torch.empty(0, dtype=t.dtype, device=t.device)
