"""Run folders and stage caching.

Each stage writes into its own folder of the run folder and finishes by writing `done.json`
(atomically) holding the hash of its inputs and the sha256 of every file it wrote. A stage
whose `done.json` holds the same key and whose files still match is skipped on a re-run; one
that was interrupted has no `done.json` and runs again; one whose inputs changed has another
key, and one whose files were edited, truncated or removed fails the check: both run again,
replacing what was there (the latter with a note saying which file did not match).

One run folder has one writer: `RunDir` holds an flock on `<run>/.qval.lock` for as long as it
lives, so a second process aiming at the same folder stops at once instead of interleaving
stages. The kernel drops the lock when its holder dies, so a killed run never blocks the next.
"""

from __future__ import annotations

import fcntl
import importlib.metadata as md
import os
import shutil
import sys
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import StageError, StorageError
from .io import atomic_write_json, hash_json, read_json, sha256_file

LOCK_FILE = ".qval.lock"
DONE_FILE = "done.json"

#: the libraries whose versions key a stage that runs the models (calibration, the export, the gates, the snapshot)
KEY_PACKAGES = ("torch", "transformers", "nvidia-modelopt", "qval")


def versions(packages: tuple[str, ...] = KEY_PACKAGES) -> dict[str, str | None]:
    """The installed version of each package (None where it is not installed): the one place every key and
    report reads library versions from."""
    out: dict[str, str | None] = {}
    for pkg in packages:
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            out[pkg] = None
    return out


def stage_files(folder: Path) -> dict[str, str]:
    """sha256 of every file under a stage folder but its marker and leftover temporaries."""
    return {str(p.relative_to(folder)): sha256_file(p) for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != DONE_FILE and not (p.name.startswith(".") and p.name.endswith(".tmp"))}


def mismatch(folder: Path, recorded: dict[str, str]) -> str | None:
    """The first recorded file that is missing or changed, described; None when all match."""
    for name, digest in recorded.items():
        p = folder / name
        if not p.is_file():
            return f"{name} is missing"
        if sha256_file(p) != digest:
            return f"{name} does not match the sha256 recorded when the stage finished (edited or truncated)"
    return None


@dataclass
class Stage:
    name: str
    path: Path
    key: str
    note: str | None = None  # why a stored stage was not reused (its files did not match)
    _verified: bool = field(default=False, repr=False)

    @property
    def done_file(self) -> Path:
        return self.path / DONE_FILE

    def is_done(self) -> bool:
        """Finished with these inputs and its files as written; a mismatch is noted and means not done."""
        if self._verified:
            return True
        if not self.done_file.is_file():
            return False
        try:
            done = read_json(self.done_file)
        except (ValueError, OSError):
            self._reject("done.json is unreadable")  # an unreadable marker is no marker
            return False
        if not isinstance(done, dict) or done.get("key") != self.key:
            return False
        files = done.get("files")
        problem = "done.json records no file hashes (written by an older qval)" if not isinstance(files, dict) \
            else mismatch(self.path, files)
        if problem:
            self._reject(problem)
            return False
        self._verified = True
        return True

    def _reject(self, problem: str) -> None:
        if self.note is None:
            self.note = f"stage {self.name}: {problem}; recomputing it"
            print(f"qval: note: {self.path}: {self.note}", file=sys.stderr)

    def begin(self) -> float:
        """Clear a stale or half-finished stage folder and start afresh."""
        self._verified = False
        if self.path.exists():
            shutil.rmtree(self.path)
        self.path.mkdir(parents=True)
        return time.perf_counter()

    def finish(self, started: float, meta: dict[str, Any] | None = None) -> None:
        atomic_write_json(self.done_file, {"key": self.key, "seconds": round(time.perf_counter() - started, 2), **(meta or {}),
                                           "files": stage_files(self.path)})
        self._verified = True

    def meta(self) -> dict[str, Any]:
        if not self.done_file.is_file():
            raise StageError(f"{self.path}: stage {self.name} has not finished")
        return read_json(self.done_file)


class _RunLock:
    """An exclusive flock on a run folder's lock file, held while this object lives."""

    fd = -1

    def __init__(self, folder: Path) -> None:
        path = folder / LOCK_FILE
        try:
            self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as err:
            raise StorageError(f"{folder}: cannot write in the run folder ({err.strerror}); give --out (or report.dir) "
                               f"a folder you can write.") from None
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(self.fd, 64, 0).decode("ascii", "replace").strip() or "unknown"
            os.close(self.fd)
            self.fd = -1
            raise StorageError(f"{folder} is in use by another qval run (pid {holder}); wait for it to finish, or give this "
                               f"run another --out folder. Two runs writing one folder would mix their stages.") from None
        try:
            os.ftruncate(self.fd, 0)
            os.pwrite(self.fd, f"{os.getpid()}\n".encode(), 0)
        except OSError as err:  # a full disk: not even the pid fits
            raise StorageError(f"{path}: cannot write the run folder's lock file ({err.strerror}); free some space or "
                               f"give --out (or report.dir) another disk.") from None

    def __del__(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)  # closing the last descriptor releases the flock


#: locks this process holds, by folder: a second RunDir on the same folder in this process shares it
_HELD: "weakref.WeakValueDictionary[str, _RunLock]" = weakref.WeakValueDictionary()
_last_run: list[Path] = []


def last_run_folder() -> Path | None:
    """The run folder this process opened last (where a crash report belongs), if any."""
    return _last_run[-1] if _last_run else None


def forget_last_run_folder() -> None:
    """A new command starts with no run folder (the CLI calls this; tests run many commands per process)."""
    _last_run.clear()


def _make_folder(path: Path) -> None:
    """mkdir -p with messages: a file in the way, or a folder that cannot be written."""
    for parent in [path, *path.parents]:
        if parent.exists():
            if not parent.is_dir():
                raise StorageError(f"{parent} is a file, not a folder; give --out (or report.dir) a folder for run folders.")
            break
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise StorageError(f"{path}: cannot create the run folder ({err.strerror}); give --out (or report.dir) a folder "
                           f"you can write.") from None


class RunDir:
    """reports/<name>/ : one folder per candidate; stages inside it; one writer at a time."""

    def __init__(self, root: Path, name: str) -> None:
        self.path = Path(root) / name
        _make_folder(self.path)
        key = str(self.path.resolve())
        lock = _HELD.get(key)
        if lock is None:
            lock = _RunLock(self.path)
            _HELD[key] = lock
        self._lock = lock
        _last_run[:] = [self.path]
        self.log: dict[str, dict[str, Any]] = {}

    def stage(self, name: str, inputs: Any) -> Stage:
        return Stage(name=name, path=self.path / name, key=hash_json({"stage": name, "inputs": inputs}))

    def record(self, stage: Stage, cached: bool) -> None:
        meta = stage.meta()
        self.log[stage.name] = {"key": stage.key, "cached": cached, "seconds": meta.get("seconds")}
        if meta.get("memory"):  # the phase's peak memory (qval.memory), as the run that computed it measured
            self.log[stage.name]["memory"] = meta["memory"]
        if stage.note:
            self.log[stage.name]["note"] = stage.note
