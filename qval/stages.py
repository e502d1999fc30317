"""Run folders and stage caching.

Each stage writes into its own folder of the run folder and finishes by writing `done.json`
(atomically) holding the hash of its inputs. A stage whose `done.json` holds the same key is
skipped on a re-run; one that was interrupted has no `done.json` and runs again; one whose
inputs changed has another key and runs again, replacing what was there.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import StageError
from .io import atomic_write_json, hash_json, read_json


@dataclass
class Stage:
    name: str
    path: Path
    key: str

    @property
    def done_file(self) -> Path:
        return self.path / "done.json"

    def is_done(self) -> bool:
        if not self.done_file.is_file():
            return False
        try:
            return read_json(self.done_file).get("key") == self.key
        except (ValueError, OSError):
            return False  # an unreadable marker is no marker

    def begin(self) -> float:
        """Clear a stale or half-finished stage folder and start afresh."""
        if self.path.exists():
            shutil.rmtree(self.path)
        self.path.mkdir(parents=True)
        return time.perf_counter()

    def finish(self, started: float, meta: dict[str, Any] | None = None) -> None:
        atomic_write_json(self.done_file, {"key": self.key, "seconds": round(time.perf_counter() - started, 2), **(meta or {})})

    def meta(self) -> dict[str, Any]:
        if not self.done_file.is_file():
            raise StageError(f"{self.path}: stage {self.name} has not finished")
        return read_json(self.done_file)


class RunDir:
    """reports/<name>/ : one folder per candidate; stages inside it."""

    def __init__(self, root: Path, name: str) -> None:
        self.path = Path(root) / name
        self.path.mkdir(parents=True, exist_ok=True)
        self.log: dict[str, dict[str, Any]] = {}

    def stage(self, name: str, inputs: Any) -> Stage:
        return Stage(name=name, path=self.path / name, key=hash_json({"stage": name, "inputs": inputs}))

    def record(self, stage: Stage, cached: bool) -> None:
        meta = stage.meta()
        self.log[stage.name] = {"key": stage.key, "cached": cached, "seconds": meta.get("seconds")}
