"""Where a gate's seconds go: named functions timed inclusively, the device synced at each edge.

    with spans.recording(spans.GATE_SPANS) as rec:
        run_gate(...)
    rec.table()   # {label: {"calls": n, "s": inclusive seconds}}, plus torch.compile's own times

Each wrapped call syncs the GPU before and after (the device's queued work is charged to the call
that queued it, not to whichever later call waits). A call made while a CUDA graph is being
captured is not synced (a sync is illegal there) and is charged to the capture. Nested spans are
inclusive: the table is a tree read by its labels, not a sum. Benchmarks only: the syncs cost a
little time themselves, so the run that times the whole gate is a separate one without them.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

# (module, attribute path, label) — the gate's stages and the engines' public work inside them
GATE_SPANS = [
    ("qval.pipeline", "calibrate", "calibrate"),
    ("qval.pipeline", "build", "build"),
    ("qval.engines.leanfp8", "install", "build/leanfp8.install"),
    ("qval.metrics.tokens", "token_stats", "gate1+/token_stats"),
    ("qval.gates.agreement.run", "summarize", "gate1/summarize"),
    ("qval.gates.quality.run", "sliding_nll", "gate2/sliding_nll"),
    ("qval.gates.quality.run", "bleu_part", "gate2/bleu"),
    ("qval.gates.longgen.run", "summarize", "gate3/summarize"),
    ("qval.gates.teacher_forced", "teacher_forced_rows", "gate3/teacher_forced_rows"),
    ("qval.gates.teacher_forced", "judge_nll_rows", "gate3/judge_nll_rows"),
    ("qval.diagnostics.stage", "run_diagnostics", "diagnostics"),
    ("qval.engines.hf", "HFEngine.logits", "engine.logits"),
    ("qval.engines.hf", "HFEngine.generate", "engine.generate"),
    ("qval.engines.static_decode", "StaticDecoder.__init__", "static/init"),
    ("qval.engines.static_decode", "StaticDecoder.run", "static/run"),
]


class Recorder:
    def __init__(self) -> None:
        self.spans: dict[str, list[float]] = {}
        self.missing: list[str] = []

    def table(self) -> dict[str, Any]:
        out: dict[str, Any] = {k: {"calls": len(v), "s": round(sum(v), 3)} for k, v in sorted(self.spans.items())}
        if self.missing:
            out["not found"] = self.missing
        try:
            from torch._dynamo.utils import compile_times

            out["torch.compile"] = compile_times(repr="str", aggregate=True)
        except Exception as err:  # noqa: BLE001 - a torch without it
            out["torch.compile"] = f"unavailable: {err}"
        return out


def _sync() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized() and not torch.cuda.is_current_stream_capturing():
        torch.cuda.synchronize()


def _wrap(fn: Any, label: str, rec: Recorder) -> Any:
    def timed(*args: Any, **kwargs: Any) -> Any:
        _sync()
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            _sync()
            rec.spans.setdefault(label, []).append(time.perf_counter() - t0)

    timed.__wrapped__ = fn  # type: ignore[attr-defined]
    return timed


@contextmanager
def recording(targets: list[tuple[str, str, str]]) -> Iterator[Recorder]:
    rec = Recorder()
    undo: list[tuple[Any, str, Any]] = []
    for mod_name, path, label in targets:
        try:
            owner: Any = importlib.import_module(mod_name)
            *parents, attr = path.split(".")
            for p in parents:
                owner = getattr(owner, p)
            fn = owner.__dict__[attr] if isinstance(owner, type) else getattr(owner, attr)
        except (ImportError, AttributeError, KeyError):  # renamed or gone since the table was written: said, not fatal
            rec.missing.append(f"{mod_name}.{path}")
            continue
        undo.append((owner, attr, fn))
        setattr(owner, attr, _wrap(fn, label, rec))
    # modules that imported a wrapped function by name keep their own reference: patch those too
    import sys

    for mod in list(sys.modules.values()):
        if mod is None or not getattr(mod, "__name__", "").startswith("qval"):
            continue
        for owner, attr, fn in list(undo):
            if not isinstance(owner, type) and getattr(mod, attr, None) is fn and mod is not owner:
                undo.append((mod, attr, fn))
                setattr(mod, attr, getattr(owner, attr))
    try:
        yield rec
    finally:
        for owner, attr, fn in reversed(undo):
            setattr(owner, attr, fn)
