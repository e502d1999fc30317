"""The snapshot's files: `<report dir>/.reference/snapshot/<key>/` beside the generation cache.

The folder's key hashes the reference's identity (model fingerprint, the dtype and device it
computes in, CUDA numerics settings), the library versions that run it, and the stored form
(`topk`, or exact); each entry's own key hashes the call: which engine method, its token ids
(the data, the tokenizer and the gate's windowing in one) and its settings (piece size,
generation settings, intra-op threads). So the folder is content-addressed by (model, data,
gate settings, versions), a candidate that asks what an earlier one asked reads it back, and a
change of any input is a new entry, never a stale answer.

Entries are written atomically: two processes that miss at once both compute, the last rename
wins with the same content; a truncated or unreadable entry is a miss, recomputed and rewritten.
"""

from __future__ import annotations

import json
import time
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from ..engines.base import Generation
from ..io import atomic_write, atomic_write_json, hash_json, read_json
from ..logits import Compact

SNAPSHOT_VERSION = 1


class SnapshotStore:
    def __init__(self, root: Path, inputs: dict[str, Any]) -> None:
        self.inputs = {"snapshot_version": SNAPSHOT_VERSION, **inputs}
        self.key = hash_json(self.inputs)
        self.path = Path(root) / "snapshot" / self.key[:16]
        self.written = 0  # entries this process computed and stored
        self.bytes_written = 0

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
        atomic_write_json(path, m)
        return m

    def _file(self, call_key: str, ext: str) -> Path:
        return self.path / "calls" / call_key[:2] / f"{call_key}.{ext}"

    # ---- logits: a list of Compact blocks ------------------------------------------------
    def get_logits(self, call_key: str) -> list[Compact] | None:
        path = self._file(call_key, "npz")
        if not path.is_file():
            return None
        try:
            with np.load(path, allow_pickle=False) as z:
                meta = json.loads(bytes(z["meta"]).decode("utf-8"))
                if meta.get("key") != call_key:
                    return None
                blocks = [Compact.from_stored({f: z[f"{i}.{f}"] for f in meta["fields"][i]}, meta["vocab"])
                          for i in range(meta["blocks"])]
        except (OSError, ValueError, KeyError, TypeError, zipfile.BadZipFile, EOFError):
            return None
        return blocks

    def put_logits(self, call_key: str, blocks: list[Compact]) -> None:
        self.manifest()
        arrays: dict[str, np.ndarray] = {}
        names = []
        for i, b in enumerate(blocks):
            stored = b.stored()
            names.append(sorted(stored))
            arrays.update({f"{i}.{k}": v for k, v in stored.items()})
        meta = {"key": call_key, "blocks": len(blocks), "fields": names, "vocab": blocks[0].vocab if blocks else 0}
        arrays["meta"] = np.frombuffer(json.dumps(meta).encode("utf-8"), dtype=np.uint8)
        path = self._file(call_key, "npz")
        needed = sum(a.nbytes for a in arrays.values())

        def write(p: Path) -> None:
            with open(p, "wb") as f:
                np.savez(f, **arrays)

        atomic_write(path, write, needed=needed)
        self.written += 1
        self.bytes_written += needed

    # ---- generations -----------------------------------------------------------------------
    def get_generation(self, call_key: str) -> Generation | None:
        path = self._file(call_key, "json")
        if not path.is_file():
            return None
        try:
            blob = read_json(path)
            if blob.get("key") != call_key:
                return None
            gen = Generation.from_dict(blob["generation"])
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None
        return gen

    def put_generation(self, call_key: str, gen: Generation) -> None:
        # no timing in the entry: the folder's bytes are the same from run to run (the report states them)
        self.manifest()
        atomic_write_json(self._file(call_key, "json"), {"key": call_key, "generation": gen.to_dict()})
        self.written += 1

    def size_bytes(self) -> int:
        """Bytes the folder holds now (every entry, of every candidate that filled it)."""
        return sum(p.stat().st_size for p in self.path.rglob("*") if p.is_file()) if self.path.is_dir() else 0
