"""The reference's store: `<report dir>/.reference/snapshot/<key>/`, its answers (the snapshot's logits, its generations).

The folder's key hashes the reference's identity (model fingerprint, the dtype and device it
computes in, CUDA numerics settings), the library versions that run it, and the stored form
(`topk`, or exact); each entry's own key hashes the call: which engine method, its token ids
(the data, the tokenizer and the gate's windowing in one) and its settings (piece size,
generation settings, intra-op threads). So the folder is content-addressed by (model, data,
gate settings, versions), a candidate that asks what an earlier one asked reads it back, and a
change of any input is a new entry, never a stale answer.

Entries are written atomically: two processes that miss at once both compute, the last rename
wins with the same content. The snapshot is evidence every later candidate's verdict rests on, so
each entry records the sha256 of its content (`_digest`: the entry's meta, its call key among them,
and each array's name, dtype, shape and bytes, in name order) and every read verifies it and the
call key. An entry that fails (edited, even into a valid npz; truncated; unreadable) is a miss:
recomputed and rewritten, with a note naming it and why (`notes`, counted in `integrity()`, which
the report's snapshot description carries). A process killed while writing leaves at most a
temporary file beside the entries, never a partial entry under an entry's name.

The digest guards against accidents and naive edits (a torn copy, a lost write, an array changed
by hand): it is not a signature. Whoever edits an entry and recomputes its digest with this
module's function is out of its scope; so is anyone who can rewrite the folder.
"""

from __future__ import annotations

import hashlib
import io
import json
import sys
import time
import zipfile
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from ..engines.base import Generation
from ..io import atomic_write, atomic_write_json, hash_json, read_json
from ..logits import Compact

SNAPSHOT_VERSION = 2  # 2: each entry records the sha256 of its content

#: why a stored entry was recomputed, as `integrity()` counts it
EDITED, TRUNCATED, UNREADABLE = "edited", "truncated", "unreadable"


class Damaged(Exception):
    """A stored entry that fails its check: `why` is EDITED, TRUNCATED or UNREADABLE."""

    def __init__(self, why: str, detail: str) -> None:
        super().__init__(detail)
        self.why = why


def _digest(meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> str:
    """sha256 of an entry: its meta (but the digest itself), then each array's name, dtype, shape and
    bytes in C order, by name: the same for the arrays written and the arrays read back."""
    h = hashlib.sha256(json.dumps({k: v for k, v in meta.items() if k != "sha256"}, sort_keys=True).encode("utf-8"))
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name])
        h.update(f"\n{name}|{a.dtype.str}|{a.shape}\n".encode("utf-8"))
        h.update(a.reshape(-1).view(np.uint8))
    return h.hexdigest()


def _check(meta: dict[str, Any], digest: str, call_key: str) -> None:
    if not meta.get("sha256"):
        raise Damaged(EDITED, "it records no content hash (edited, or written by a qval that recorded none)")
    if meta["sha256"] != digest:
        raise Damaged(EDITED, "its content does not match the sha256 recorded when it was written (edited)")
    if meta.get("key") != call_key:
        raise Damaged(EDITED, "it records another call's key (edited or moved)")


def _read(path: Path) -> bytes:
    try:
        with path.open("rb") as f:
            return f.read()
    except OSError as err:
        raise Damaged(UNREADABLE, f"it cannot be read ({type(err).__name__}: {err.strerror or err})") from None


def _load_npz(path: Path) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """An entry's meta and the arrays it names, or Damaged."""
    data = _read(path)
    if b"PK\x05\x06" not in data[-(65536 + 22):]:  # a zip ends with its end-of-directory record
        raise Damaged(TRUNCATED, f"it is cut short ({len(data)} bytes, not a whole npz file: truncated)")
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            meta = json.loads(bytes(z["meta"]).decode("utf-8"))
            arrays = {f"{i}.{f}": z[f"{i}.{f}"] for i in range(meta["blocks"]) for f in meta["fields"][i]}
    except (OSError, ValueError, KeyError, TypeError, IndexError, zipfile.BadZipFile, EOFError) as err:
        raise Damaged(EDITED, f"it is not a valid entry ({type(err).__name__}: {err}; edited)") from None
    if not isinstance(meta, dict):
        raise Damaged(EDITED, "its meta is not a mapping (edited)")
    return meta, arrays


def _load_json(path: Path) -> dict[str, Any]:
    text = _read(path)
    try:
        blob = json.loads(text.decode("utf-8"))
    except json.JSONDecodeError as err:
        if not text.rstrip().endswith(b"}"):  # an entry is one JSON object, written whole
            raise Damaged(TRUNCATED, f"its JSON ends early ({len(text)} bytes: truncated)") from None
        raise Damaged(EDITED, f"it is not valid JSON ({err.msg} at offset {err.pos}; edited)") from None
    except UnicodeDecodeError:
        raise Damaged(EDITED, "it is not UTF-8 text (edited)") from None
    if not isinstance(blob, dict):
        raise Damaged(EDITED, "it is not a JSON object (edited)")
    return blob


class SnapshotStore:
    def __init__(self, root: Path, inputs: dict[str, Any]) -> None:
        self.inputs = {"snapshot_version": SNAPSHOT_VERSION, **inputs}
        self.key = hash_json(self.inputs)
        self.path = Path(root) / "snapshot" / self.key[:16]
        self.written = 0  # entries this process computed and stored
        self.bytes_written = 0
        self.verified = 0  # entries read back whose content and call key matched
        self.recomputed: Counter[str] = Counter()  # entries that did not, by why (EDITED, TRUNCATED, UNREADABLE)
        self.notes: list[str] = []  # one per such entry, naming it
        self._noted: set[Path] = set()

    def integrity(self) -> dict[str, Any]:
        """This process's reads of the folder: entries verified, entries recomputed (and why), the notes."""
        return {"entries_verified": self.verified, "entries_recomputed": sum(self.recomputed.values()),
                "recomputed": dict(self.recomputed), "notes": list(self.notes)}

    def _damaged(self, path: Path, err: Damaged) -> None:
        """A stored entry that failed its check: counted and noted once (it is recomputed and rewritten; a
        lookup and the call that follows it may both read it before then)."""
        if path in self._noted:
            return
        self._noted.add(path)
        self.recomputed[err.why] += 1
        note = f"reference snapshot entry {path}: {err.why}: {err}; recomputed"
        self.notes.append(note)
        print(f"qval: note: {note}", file=sys.stderr)

    def manifest(self) -> dict[str, Any]:
        """The folder's manifest (written with its first entry): key, inputs, when it was created."""
        path = self.path / "manifest.json"
        try:
            m = read_json(path)
            if isinstance(m, dict) and m.get("key") == self.key:
                return m
        except (OSError, ValueError):
            pass
        m = {"key": self.key, "inputs": self.inputs, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        self.path.mkdir(parents=True, exist_ok=True)
        atomic_write_json(path, m, what="the reference snapshot's manifest.json")
        return m

    def describe(self, topk: Any) -> dict[str, Any]:
        """The folder as the report names it: key, path, when it was created, stored form (`topk`), bytes."""
        m = self.manifest() if self.path.is_dir() else {"created": None}
        return {"key": self.key, "path": str(self.path), "created": m.get("created"), "topk": topk, "bytes": self.size_bytes()}

    def _file(self, call_key: str, ext: str) -> Path:
        return self.path / "calls" / call_key[:2] / f"{call_key}.{ext}"

    # ---- logits: a list of Compact blocks ------------------------------------------------
    def get_logits(self, call_key: str) -> list[Compact] | None:
        path = self._file(call_key, "npz")
        if not path.is_file():
            return None
        try:
            meta, arrays = _load_npz(path)
            _check(meta, _digest(meta, arrays), call_key)
            blocks = [Compact.from_stored({f: arrays[f"{i}.{f}"] for f in meta["fields"][i]}, meta["vocab"])
                      for i in range(meta["blocks"])]
        except Damaged as err:
            self._damaged(path, err)
            return None
        except (ValueError, KeyError, TypeError) as err:  # whole and as written, but not blocks this qval reads
            self._damaged(path, Damaged(EDITED, f"its arrays are not compact logits ({type(err).__name__}: {err})"))
            return None
        self.verified += 1
        return blocks

    def put_logits(self, call_key: str, blocks: list[Compact]) -> None:
        self.manifest()
        arrays: dict[str, np.ndarray] = {}
        names = []
        for i, b in enumerate(blocks):
            stored = b.stored()
            names.append(sorted(stored))
            arrays.update({f"{i}.{k}": v for k, v in stored.items()})
        meta: dict[str, Any] = {"key": call_key, "blocks": len(blocks), "fields": names, "vocab": blocks[0].vocab if blocks else 0}
        meta["sha256"] = _digest(meta, arrays)
        arrays["meta"] = np.frombuffer(json.dumps(meta).encode("utf-8"), dtype=np.uint8)
        path = self._file(call_key, "npz")
        needed = sum(a.nbytes for a in arrays.values())

        def write(p: Path) -> None:
            with open(p, "wb") as f:
                np.savez(f, **arrays)

        atomic_write(path, write, needed=needed, what=f"reference snapshot entry {path.name}")
        self.written += 1
        self.bytes_written += needed

    # ---- generations -----------------------------------------------------------------------
    def generation_path(self, call_key: str) -> Path:
        """The file of a generation's entry (the report names it)."""
        return self._file(call_key, "json")

    def get_generation(self, call_key: str) -> Generation | None:
        path = self.generation_path(call_key)
        if not path.is_file():
            return None
        try:
            blob = _load_json(path)
            _check(blob, hash_json({k: v for k, v in blob.items() if k != "sha256"}), call_key)
            gen = Generation.from_dict(blob["generation"])
        except Damaged as err:
            self._damaged(path, err)
            return None
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            self._damaged(path, Damaged(EDITED, f"it holds no generation this qval reads ({type(err).__name__}: {err})"))
            return None
        self.verified += 1
        return gen

    def put_generation(self, call_key: str, gen: Generation) -> None:
        # no timing in the entry: the folder's bytes are the same from run to run (the report states them)
        self.manifest()
        entry = {"key": call_key, "generation": gen.to_dict()}
        path = self.generation_path(call_key)
        atomic_write_json(path, {**entry, "sha256": hash_json(entry)}, what=f"reference snapshot entry {path.name}")
        self.written += 1

    def size_bytes(self) -> int:
        """Bytes the folder holds now (every entry, of every candidate that filled it)."""
        return sum(p.stat().st_size for p in self.path.rglob("*") if p.is_file()) if self.path.is_dir() else 0
