"""`qval sweep --parallel`: candidates gated at the same time, one worker process per GPU (or per
group of GPUs for a model that needs several), all sharing one reference snapshot.

The snapshot is filled first, once, by `qval reference` in the first slot; then each config file
is a `qval gate` process in the first free slot (`CUDA_VISIBLE_DEVICES` names its GPUs), writing
its run folder under the sweep's folder, where the snapshot's entries are read back (they are
content-addressed and written atomically: workers never see half an entry). The parent reads
each candidate's report.json back for the ranking. `cpu:N` runs N workers on the CPU with the
GPUs hidden and the cores shared out (how the tests run this on a machine without GPUs).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence, TypeVar

from .errors import ConfigError

J = TypeVar("J")


@dataclass(frozen=True)
class Slot:
    """One worker's devices: `gpus` for CUDA_VISIBLE_DEVICES ("" hides every GPU), and for a CPU
    slot the intra-op threads it may use."""

    gpus: str
    threads: int | None = None

    def env(self) -> dict[str, str]:
        out = {"CUDA_VISIBLE_DEVICES": self.gpus}
        if self.threads is not None:
            out["OMP_NUM_THREADS"] = str(self.threads)
        return out


def slots(spec: str | None, visible: int, cores: int) -> list[Slot]:
    """The workers of `--parallel SPEC`: "auto" one per visible GPU; "N" N workers over the visible
    GPUs, each given visible // N of them; "cpu:N" N workers on the CPU (GPUs hidden, cores split).
    Fewer than two workers: [] (the sweep runs in turn, in this process).

    >>> [s.gpus for s in slots("auto", 4, 16)], [s.gpus for s in slots("2", 4, 16)], slots("cpu:2", 0, 2)
    (['0', '1', '2', '3'], ['0,1', '2,3'], [Slot(gpus='', threads=1), Slot(gpus='', threads=1)])
    >>> slots("auto", 1, 16), slots(None, 8, 16)
    ([], [])
    """
    if spec is None:
        return []
    if spec.startswith("cpu:"):
        n = _count(spec.removeprefix("cpu:"), spec)
        return [Slot("", max(1, cores // n)) for _ in range(n)] if n > 1 else []
    n = visible if spec == "auto" else _count(spec, spec)
    if n > visible:
        raise ConfigError(f"--parallel {spec}: {n} workers need at least {n} GPUs; {visible} visible "
                          "(CUDA_VISIBLE_DEVICES). Use --parallel auto, a smaller number, or cpu:N.")
    if n < 2:
        return []
    per = visible // n
    return [Slot(",".join(str(g) for g in range(i * per, (i + 1) * per))) for i in range(n)]


def _count(text: str, spec: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise ConfigError(f"--parallel {spec}: give auto, a number of workers, or cpu:N.") from None
    if n < 1:
        raise ConfigError(f"--parallel {spec}: the number of workers must be at least 1.")
    return n


def schedule(jobs: Sequence[J], workers: Sequence[Slot], start: Callable[[J, Slot], Any],
             poll_s: float = 0.2) -> list[tuple[J, int, Slot]]:
    """Each job in the first free worker (`start(job, slot)` returns a process: poll() → None while
    it runs, else its exit code); (job, exit code, slot) in the jobs' order once all have ended."""
    pending = list(enumerate(jobs))
    running: dict[int, tuple[int, Any]] = {}  # worker index -> (job index, process)
    done: dict[int, tuple[int, Slot]] = {}
    while pending or running:
        for w in [w for w in range(len(workers)) if w not in running]:
            if not pending:
                break
            i, job = pending.pop(0)
            running[w] = (i, start(job, workers[w]))
        for w, (i, proc) in list(running.items()):
            code = proc.poll()
            if code is not None:
                done[i] = (code, workers[w])
                del running[w]
        if running:
            time.sleep(poll_s)
    return [(job, *done[i]) for i, job in enumerate(jobs)]


def qval_process(args: list[str], slot: Slot, log: Path) -> subprocess.Popen:
    """`python -m qval ARGS` in `slot`'s devices, its output into `log`."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as out:  # the child keeps its own descriptor
        return subprocess.Popen([sys.executable, "-m", "qval", *args], stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, **slot.env()})


def last_line(log: Path) -> str:
    try:
        lines = [x for x in log.read_text(encoding="utf-8", errors="replace").splitlines() if x.strip()]
    except OSError:
        return "(no log)"
    return lines[-1] if lines else "(empty log)"
