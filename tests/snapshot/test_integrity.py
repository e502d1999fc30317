"""The reference snapshot is evidence, verified on every read (issue 28): each entry records the
sha256 of its content and the key of the call that produced it; an entry that was edited (still a
valid npz or JSON), truncated or cannot be read is recomputed with a note naming it and why, and
the store counts the entries verified and recomputed (the report: tests/snapshot/test_report.py).
A full disk while an entry is written names the entry."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from qval.snapshot.store import SnapshotStore

from .test_engine import Counting, snap

X = torch.tensor([[5, 6, 7, 8, 9, 10]])


def entries(store: SnapshotStore, ext: str) -> list[Path]:
    return sorted((store.path / "calls").rglob(f"*.{ext}"))


def rewrite_npz(path: Path, change) -> None:  # noqa: ANN001
    """Rewrite an entry as a valid npz with `change(arrays, meta)` applied (the recorded hash left as it was)."""
    with np.load(path) as z:
        arrays = {k: z[k].copy() for k in z.files}
    meta = json.loads(bytes(arrays.pop("meta")).decode("utf-8"))
    change(arrays, meta)
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode("utf-8"), dtype=np.uint8)
    with open(path, "wb") as f:
        np.savez(f, **arrays)


def halve_and_move_argmax(arrays: dict, meta: dict) -> None:
    """What the issue did by hand: the true token's log-probability doubled (its probability
    halved, roughly) and the argmax moved, on every position."""
    arrays["0.next_logp"] = arrays["0.next_logp"] * 2
    arrays["0.best"] = (arrays["0.best"] + 1) % 64


def test_each_entry_records_its_content_hash_and_its_call(tmp_path):
    s = snap(tmp_path, Counting())
    s.logits(X)
    s.generate([[1, 2]], 5, suppress_eos=True, batch_size=1)
    [npz], [gen] = entries(s.store, "npz"), entries(s.store, "json")
    with np.load(npz) as z:
        meta = json.loads(bytes(z["meta"]).decode("utf-8"))
    assert meta["key"] == s._key("logits", ids=X.tolist()) == npz.stem and len(meta["sha256"]) == 64
    blob = json.loads(gen.read_text(encoding="utf-8"))
    assert blob["key"] == gen.stem and len(blob["sha256"]) == 64


@pytest.mark.parametrize(("damage", "why"), [
    (lambda p: rewrite_npz(p, halve_and_move_argmax), "edited"),  # a valid npz, its recorded hash stale
    (lambda p: rewrite_npz(p, lambda a, m: m.pop("sha256", None)), "edited"),  # no hash at all
    (lambda p: rewrite_npz(p, lambda a, m: m.update(vocab=65)), "edited"),  # the meta itself edited
    (lambda p: rewrite_npz(p, lambda a, m: m.update(key="0" * 64)), "edited"),  # another call's entry
    (lambda p: p.write_bytes(p.read_bytes()[: len(p.read_bytes()) // 2]), "truncated"),
    (lambda p: p.write_bytes(b""), "truncated"),
])
def test_a_damaged_logits_entry_is_recomputed_with_a_note(tmp_path, capsys, damage, why):
    real = Counting()
    want = snap(tmp_path, real).logits(X)
    [path] = entries(snap(tmp_path, real).store, "npz")
    damage(path)
    again = snap(tmp_path, real)
    got = again.logits(X)
    assert real.passes == 2, "the damaged entry was trusted"
    assert torch.equal(got.best, want.best) and torch.equal(got.next_logp.nan_to_num(), want.next_logp.nan_to_num())
    assert again.store.recomputed == {why: 1} and again.store.verified == 0
    [note] = again.store.notes
    assert str(path) in note and why in note and "recomputed" in note
    assert f"qval: note: {note}" in capsys.readouterr().err
    third = snap(tmp_path, real)  # the rewritten entry verifies
    third.logits(X)
    assert real.passes == 2 and third.store.verified == 1 and third.store.notes == [] and not third.store.recomputed


def test_an_unreadable_entry_is_recomputed_with_a_note(tmp_path, monkeypatch):
    real = Counting()
    snap(tmp_path, real).logits(X)
    [path] = entries(snap(tmp_path, real).store, "npz")
    real_open = Path.open

    def refuse(self: Path, *args, **kwargs):  # noqa: ANN002, ANN003, ANN202 - as root, chmod 000 would not stop a read
        if self == path:
            raise PermissionError(13, "Permission denied", str(self))
        return real_open(self, *args, **kwargs)

    monkeypatch.setattr(Path, "open", refuse)
    again = snap(tmp_path, real)
    again.logits(X)
    assert real.passes == 2 and again.store.recomputed == {"unreadable": 1}
    assert str(path) in again.store.notes[0] and "Permission denied" in again.store.notes[0]


@pytest.mark.parametrize(("damage", "why"), [
    (lambda b: b["generation"]["tokens"][0].__setitem__(0, 0), "edited"),  # one token changed, hash kept
    (lambda b: b.pop("sha256"), "edited"),
])
def test_an_edited_generation_is_recomputed_with_a_note(tmp_path, damage, why):
    real = Counting()
    want = snap(tmp_path, real).generate([[1, 2]], 5, suppress_eos=True, batch_size=1)
    [path] = entries(snap(tmp_path, real).store, "json")
    blob = json.loads(path.read_text(encoding="utf-8"))
    damage(blob)
    path.write_text(json.dumps(blob), encoding="utf-8")
    again = snap(tmp_path, real)
    got = again.generate([[1, 2]], 5, suppress_eos=True, batch_size=1)
    assert real.generate_calls == 2 and got.tokens == want.tokens
    assert again.store.recomputed == {why: 1} and str(path) in again.store.notes[0]


def test_a_truncated_generation_is_recomputed_with_a_note(tmp_path):
    real = Counting()
    snap(tmp_path, real).generate([[1, 2]], 5, suppress_eos=True, batch_size=1)
    [path] = entries(snap(tmp_path, real).store, "json")
    path.write_bytes(path.read_bytes()[:30])
    again = snap(tmp_path, real)
    again.generate([[1, 2]], 5, suppress_eos=True, batch_size=1)
    assert real.generate_calls == 2 and again.store.recomputed == {"truncated": 1}


def test_the_store_counts_entries_verified_and_recomputed(tmp_path):
    real = Counting()
    first = snap(tmp_path, real)
    first.logits(X)
    first.logits(X + 1)
    assert first.store.integrity() == {"entries_verified": 0, "entries_recomputed": 0, "recomputed": {}, "notes": []}
    a, _ = entries(first.store, "npz")
    a.write_bytes(a.read_bytes()[:100])
    second = snap(tmp_path, real)
    second.logits(X)
    second.logits(X + 1)
    counts = second.store.integrity()
    assert (counts["entries_verified"], counts["entries_recomputed"], counts["recomputed"]) == (1, 1, {"truncated": 1})
    assert len(counts["notes"]) == 1 and a.name in counts["notes"][0]


def test_a_full_disk_while_writing_an_entry_names_the_snapshot_entry(tmp_path, monkeypatch):
    """Issue 28, 5: the message called the entry's folder a "stage"."""
    import errno

    from qval.errors import StorageError

    def full(f, **arrays):  # noqa: ANN001, ANN003, ANN202
        f.write(b"x" * 1000)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(np, "savez", full)
    s = snap(tmp_path, Counting())
    with pytest.raises(StorageError) as err:
        s.logits(X)
    msg = str(err.value)
    key = s._key("logits", ids=X.tolist())
    assert f"while writing reference snapshot entry {key}.npz" in msg and "(stage" not in msg, msg
    assert "1000 bytes written" in msg and "free some space" in msg.lower()
    assert not [p for p in (s.store.path / "calls").rglob("*") if p.is_file()]  # nothing partial left
