"""The snapshot filled with the reference alone (`qval reference`, a sequential run's first phase)."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import torch

from ..gates import GATES, GateContext
from ..memory import PhaseMemory
from .engine import MirrorCandidate


def fill_gates(s: Any, shared: Path) -> dict[str, Any]:
    """Every enabled gate's reference work into the snapshot, with the reference alone: each gate
    runs against `MirrorCandidate` (the reference answering for the candidate from its own
    outputs), so it asks the reference exactly what it asks with a real candidate; its figures are
    discarded. What depends on a real candidate's output (the judge of its text, the answers where
    the two disagree) cannot be stored in advance. Returns each gate's use of the snapshot."""
    reference = s.ref.for_gates(shared)
    mirror = MirrorCandidate(reference)
    gates: dict[str, Any] = {}
    done: dict[str, Any] = {}
    try:
        with tempfile.TemporaryDirectory(prefix="qval-reference-") as tmp:
            for spec in GATES.ordered():
                if not spec.enabled(s.config):
                    continue
                before = reference.usage()
                folder = Path(tmp) / f"gate_{spec.name}"  # as in a run folder
                folder.mkdir()
                torch.manual_seed(s.config.seed)
                with PhaseMemory() as mem:
                    ctx = GateContext(config=s.config, reference=reference, candidate=mirror, tokenizer=s.ref.tokenizer, folder=folder,
                                      progress=s.progress, upstream=done)
                    result = spec.run(ctx)
                result.folder = folder  # gate 2 reads gate 1's positions through `done` (GateContext.upstream)
                done[spec.name] = result
                after = reference.usage()
                gates[spec.name] = {"status": result.status, "error": result.error, "memory": mem.describe(),
                                    **{k: round(after[k] - before[k], 2) for k in before}}
                if result.status == "error":  # the reference itself failed (non-finite logits): say so, stop
                    break
    finally:
        reference.mirror(False)
    return gates
