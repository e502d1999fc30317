"""The reference and the candidate decoding at the same time on a CPU, each with a share of the cores.

Greedy decoding at the gates' batch sizes is bound by memory traffic: every step reads all the
weights (540 MB for the built-in model in float32) and the KV cache for a handful of rows of
arithmetic, so a second intra-op thread shortens a decode step little, while two decodes of
different models, one core each, overlap well. Measured on this project's 2-core CPU
(benchmarks/concurrent_cpu.py, built-in model, 8 prompts × 96 new tokens): one model decodes in
7.40 s with two threads and 9.11 s with one; two models one after the other take 14.80 s, side
by side 10.19 s. A prefill is compute-bound and gains nothing (1,024 tokens: 2.14 s with two
threads, 3.77 s with one; two models 4.27 s in turn, 4.01 s side by side), so only decoding is
paired: gate 2's and gate 3's generations and gate 4's generated answers.

The first job runs in a forked copy of this process (the models are shared copy-on-write, the
result comes back pickled through a pipe), the second here. Not threads: ModelOpt's quantized
attention swaps transformers' process-wide attention function for the duration of each forward,
so a reference decoding in a thread beside a quantized candidate would run the candidate's
quantized attention (seen: AttributeError 'LlamaAttention' object has no attribute
'q_bmm_quantizer'). A process shares no such state. The forked job must not touch the parent's
other resources (progress bars, files being written): gates give it only model work.

Numbers depend on the intra-op thread count (MKL divides a product's work by it), so the rule is
fixed, not opportunistic: on a CPU, paired decoding always runs with `share()` threads per
engine, side by side or, when only one engine has work (the reference's generations came from
the cache), alone with the same count (`alone`); the reference's cached generations record the
count in their key (qval.reference). Side by side and alone give the same tokens bit for bit
(tests/engines/test_concurrent.py). GPU engines are not paired (a CUDA context does not survive a
fork), nor is anything where `os.fork` is missing: those run in turn.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import sys
import threading
import traceback
from typing import Any, Callable, Iterator, Sequence, TypeVar

import torch

T = TypeVar("T")
_lock = threading.RLock()  # the intra-op thread count is process-wide: one pairing at a time


class PartnerFailed(RuntimeError):
    """The forked job raised (its traceback is in the message) or died."""


def can_pair(engines: Sequence[Any]) -> bool:
    """Whether two engines' jobs run side by side: exactly two, both on the CPU, at least one
    intra-op thread for each, and a platform that forks."""
    if len(engines) != 2 or torch.get_num_threads() < 2 or not hasattr(os, "fork") or not sys.platform.startswith("linux"):
        return False
    return all(str(getattr(e, "device", "")).startswith("cpu") for e in engines)


def share(engines: Sequence[Any]) -> int | None:
    """Intra-op threads per engine when `engines` are paired; None when they are not."""
    return max(1, torch.get_num_threads() // len(engines)) if can_pair(engines) else None


@contextlib.contextmanager
def _threads(n: int | None) -> Iterator[None]:
    """torch's intra-op thread count set to `n` for the block (a process forked inside inherits it)."""
    if n is None:
        yield
        return
    with _lock:
        total = torch.get_num_threads()
        torch.set_num_threads(n)
        try:
            yield
        finally:
            torch.set_num_threads(total)


def _child(job: Callable[[], Any], w: int) -> None:
    """In the forked process: run the job, send (ok, result or error) back, exit without cleanup."""
    code = 0
    try:
        try:  # die with the parent (kill -9 of qval must not leave a decoder running)
            import ctypes

            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        try:
            blob = pickle.dumps((True, job()))
        except BaseException as err:  # noqa: BLE001 — reported to the parent
            blob = pickle.dumps((False, f"{type(err).__name__}: {err}\n{traceback.format_exc()}"))
            code = 1
        with os.fdopen(w, "wb") as f:
            f.write(blob)
    finally:
        os._exit(code)


def side_by_side(jobs: Sequence[Callable[[], T]], engines: Sequence[Any]) -> tuple[list[T], bool]:
    """Run `jobs` (one per engine of `engines`, two of them); their results in order, and whether
    they ran side by side. Unpaired engines run their jobs one after the other, here. The first
    job's result must pickle. An exception in the second job is raised as itself once the first
    has stopped; one in the first as `PartnerFailed` with its traceback."""
    n = share(engines)
    if n is None or len(jobs) != 2:
        return [job() for job in jobs], False
    if any(getattr(e, "mirrors", False) for e in engines):
        # the snapshot being filled (snapshot/engine.py's MirrorCandidate answers from the reference's
        # own job): in turn, each with the threads a paired run gives it, so the numerics are a pair's
        with _threads(n):
            return [job() for job in jobs], True
    with _threads(n):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            _child(jobs[0], w)
        os.close(w)
        reader = _Reader(r)
        try:
            mine = jobs[1]()
        except BaseException:
            os.kill(pid, signal.SIGKILL)
            reader.collect()
            os.waitpid(pid, 0)
            raise
        blob = reader.collect()
        _, status = os.waitpid(pid, 0)
    if not blob:
        raise PartnerFailed(f"the side-by-side decoding process died (wait status {status}) without an answer")
    ok, theirs = pickle.loads(blob)
    if not ok:
        raise PartnerFailed(f"side-by-side job failed in its process: {theirs}")
    return [theirs, mine], True


class _Reader(threading.Thread):
    """Drains the child's pipe while this process works (a result larger than the pipe's buffer
    would otherwise block the child until we finish)."""

    def __init__(self, fd: int) -> None:
        super().__init__(daemon=True)
        self.fd, self.chunks = fd, []
        self.start()

    def run(self) -> None:
        with os.fdopen(self.fd, "rb") as f:
            while chunk := f.read(1 << 20):
                self.chunks.append(chunk)

    def collect(self) -> bytes:
        """Everything the child wrote, once its end of the pipe is closed."""
        while self.is_alive():
            self.join(0.2)  # short waits, so Ctrl-C reaches the main thread
        return b"".join(self.chunks)


def alone(job: Callable[[], T], engines: Sequence[Any]) -> T:
    """One engine's share of paired work run by itself, with the thread count it has side by
    side, so its numbers are the same as if its partner were running."""
    with _threads(share(engines)):
        return job()
