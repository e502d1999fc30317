"""Atomic writes and fingerprints.

Every file qval writes goes through a temporary file in the same folder and an atomic
rename, so an interrupted run never leaves a half-written file that looks complete.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any, Callable

_UMASK = os.umask(0)
os.umask(_UMASK)

#: bytes read from each end of a large file for its quick fingerprint
_EDGE = 4 << 20


def atomic_write(path: Path, writer: Callable[[Path], None]) -> None:
    """Call `writer(tmp_path)` then rename tmp onto `path` (same folder, so the rename is atomic)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        writer(Path(tmp))
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600; give the file the usual permissions
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda p: p.write_text(text, encoding="utf-8"))


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "to_dict"):
        return obj.to_dict()
    if hasattr(obj, "model_dump"):
        return obj.model_dump(mode="json")
    if hasattr(obj, "item"):  # numpy / torch scalars
        return obj.item()
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"cannot serialise {type(obj).__name__}")


def clean_floats(obj: Any) -> Any:
    """Replace NaN/Inf by the strings "nan"/"inf"/"-inf": JSON has no such numbers, and
    silently writing null would hide exactly the failures a gate must show."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return "nan" if math.isnan(obj) else ("inf" if obj > 0 else "-inf")
    if isinstance(obj, dict):
        return {k: clean_floats(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [clean_floats(v) for v in obj]
    return obj


def to_jsonable(obj: Any) -> Any:
    return clean_floats(json.loads(json.dumps(obj, default=_json_default, allow_nan=True)))


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(to_jsonable(obj), indent=2, ensure_ascii=False) + "\n")


def read_json(path: Path) -> Any:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def hash_json(obj: Any) -> str:
    """A stable sha256 of a JSON-able object (sorted keys)."""
    blob = json.dumps(to_jsonable(obj), sort_keys=True, ensure_ascii=False).encode()
    return hashlib.sha256(blob).hexdigest()


def file_fingerprint(path: Path, *, full: bool = False) -> str:
    """sha256 of a file. Large files (> 64 MiB, unless `full`) are fingerprinted by their size
    and first and last 4 MiB: hashing a 16 GB checkpoint on every run would cost more than
    the check it protects, and any re-download or re-export changes these bytes."""
    path = Path(path)
    size = path.stat().st_size
    h = hashlib.sha256()
    h.update(str(size).encode())
    with path.open("rb") as f:
        if full or size <= 16 * _EDGE:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        else:
            h.update(f.read(_EDGE))
            f.seek(size - _EDGE)
            h.update(f.read(_EDGE))
    return h.hexdigest()


def tree_fingerprint(folder: Path, patterns: tuple[str, ...] = ("*",)) -> str:
    """Fingerprint of every file in `folder` (recursive) matching `patterns`, names included."""
    folder = Path(folder)
    h = hashlib.sha256()
    files = sorted({p for pat in patterns for p in folder.rglob(pat) if p.is_file()})
    for p in files:
        h.update(str(p.relative_to(folder)).encode())
        h.update(file_fingerprint(p).encode())
    return h.hexdigest()
