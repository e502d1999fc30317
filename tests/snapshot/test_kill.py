"""A snapshot half written when its writer is killed (kill -9 during a gate) is recovered by the
next run the way a damaged entry is: every entry that made it to disk is verified before it is
read, a missing one is computed, a torn one is recomputed with a note, and the figures are a clean
run's. A real process, SIGKILLed while it writes an entry; the reference is tests/gates/fakes.py's
stand-in engine, so the child needs no model (a few seconds, most of it importing torch)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

from qval.snapshot.engine import SnapshotReference
from qval.snapshot.store import SnapshotStore

from .test_engine import Counting

ROOT = Path(__file__).resolve().parent.parent.parent
CALLS = 6
STALL_AT = 4  # the child writes 3 entries whole and is killed in the middle of the 4th

CHILD = """
import sys, time
from pathlib import Path

import numpy as np
import torch

from qval.snapshot.engine import SnapshotReference
from qval.snapshot.store import SnapshotStore
from tests.gates.fakes import FakeEngine, walk
from tests.snapshot.test_kill import call

root, stall_at = Path(sys.argv[1]), int(sys.argv[2])
real_savez, written = np.savez, [0]


def savez(f, **arrays):
    written[0] += 1
    if written[0] == stall_at:  # half of this entry's bytes in its temporary file, then wait for the kill
        real_savez(f, **arrays)
        f.truncate(f.tell() // 2)
        f.flush()
        (root / "stalled").write_text("1")
        time.sleep(600)
    real_savez(f, **arrays)


np.savez = savez
s = SnapshotReference(FakeEngine(walk), SnapshotStore(root / ".reference", {"reference": {"fp": "kill"}}), 8, audit=False)
for i in range(int(sys.argv[3])):
    s.logits(call(i))
"""


def call(i: int) -> torch.Tensor:
    """The i-th call's tokens: 2 rows of 96, distinct per call."""
    return (torch.arange(2 * 96).reshape(2, 96) * (i + 3)) % 60


def reference(root: Path, real: Counting) -> SnapshotReference:
    return SnapshotReference(real, SnapshotStore(root / ".reference", {"reference": {"fp": "kill"}}), 8, audit=False)


def kill_while_writing(tmp_path: Path) -> Path:
    """Run the child until it is in the middle of writing entry STALL_AT, SIGKILL it; returns the snapshot folder."""
    script = tmp_path / "child.py"
    script.write_text(CHILD, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    child = subprocess.Popen([sys.executable, str(script), str(tmp_path), str(STALL_AT), str(CALLS)], cwd=ROOT, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / "stalled").exists():
            assert child.poll() is None, f"the child ended before the kill: {child.stdout.read().decode()}"
            assert time.monotonic() < deadline, "the child never reached its 4th entry"
            time.sleep(0.05)
        os.kill(child.pid, signal.SIGKILL)
        assert child.wait(30) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    return reference(tmp_path, Counting()).store.path


def test_a_snapshot_killed_while_written_is_recovered(tmp_path):
    folder = kill_while_writing(tmp_path)
    whole = sorted((folder / "calls").rglob("*.npz"))
    left = [p for p in (folder / "calls").rglob("*.tmp")]
    assert len(whole) == STALL_AT - 1 and len(left) == 1  # the kill landed inside the 4th entry's write
    # the next run: what is on disk is verified and read back, the rest computed, nothing noted (nothing torn)
    real = Counting()
    again = reference(tmp_path, real)
    got = [again.logits(call(i)) for i in range(CALLS)]
    assert again.store.integrity()["entries_verified"] == STALL_AT - 1 and real.passes == CALLS - (STALL_AT - 1)
    assert again.store.notes == [] and len(list((folder / "calls").rglob("*.npz"))) == CALLS
    clean = reference(tmp_path / "clean", Counting())
    for i, block in enumerate(got):
        want = clean.logits(call(i))
        assert torch.equal(block.best, want.best) and torch.equal(block.top_logp, want.top_logp), i
    third = reference(tmp_path, Counting())
    for i in range(CALLS):
        third.logits(call(i))
    assert third.store.integrity()["entries_verified"] == CALLS and third.real.passes == 0


def test_an_entry_torn_by_the_crash_is_recomputed_with_a_note(tmp_path):
    """What a crash that loses unflushed data leaves: an entry renamed into place but cut short."""
    folder = kill_while_writing(tmp_path)
    torn = max((folder / "calls").rglob("*.npz"), key=lambda p: p.stat().st_mtime_ns)
    torn.write_bytes(torn.read_bytes()[:300])
    real = Counting()
    again = reference(tmp_path, real)
    for i in range(CALLS):
        again.logits(call(i))
    counts = again.store.integrity()
    assert counts["entries_verified"] == STALL_AT - 2 and counts["recomputed"] == {"truncated": 1}
    assert real.passes == CALLS - (STALL_AT - 2) and torn.name in counts["notes"][0]
