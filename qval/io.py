"""Atomic writes, fingerprints and strict text reads.

Every file qval writes goes through a temporary file in the same folder and an atomic
rename, so an interrupted run never leaves a half-written file that looks complete; a disk
that fills up on the way is a `StorageError` saying what was being written and how much.
"""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable

from .errors import QvalError, StorageError


def _current_umask() -> int:
    """The process's umask, read without changing it where the OS says it (Linux's
    /proc/self/status): setting it to read it would leave a window in which another thread's
    files get the wrong mode."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


_UMASK = _current_umask()

#: bytes read from each end of a large file for its quick fingerprint
_EDGE = 4 << 20


#: below this much free space a failed write is taken for a full disk (torch.save reports one
#: as a RuntimeError without an errno)
_FULL = 1 << 20


def _size(n: int) -> str:
    """
    >>> _size(1000), _size(3 << 20), _size(5 << 30)
    ('1000 bytes', '3.0 MiB', '5.0 GiB')
    """
    if n < 1 << 20:
        return f"{n} bytes"
    return f"{n / 2**20:.1f} MiB" if n < 1 << 30 else f"{n / 2**30:.1f} GiB"


def _disk_full(err: BaseException, folder: Path) -> bool:
    if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    try:
        return isinstance(err, RuntimeError) and shutil.disk_usage(folder).free < _FULL
    except OSError:
        return False


def disk_full_message(path: Path, written: int, needed: int | None, what: str | None = None) -> str:
    """What was being written, how much of it, how much room there is, and what to do. `what`
    names the file (default: the file of a stage, whose folder is the stage's)."""
    path = Path(path)
    what = what or f"{path.name} (stage {path.parent.name})"
    try:
        free = shutil.disk_usage(path.parent).free
    except OSError:
        free = 0
    size = f"{_size(written)} written of about {_size(needed)} needed" if needed else f"{_size(written)} written before the disk filled"
    return (f"{path}: no space left on the device while writing {what}: {size}, "
            f"{_size(free)} free in {path.parent}. Free some space or point --out (or report.dir) at a disk with room; "
            f"finished stages are kept (reference snapshot entries too) and the next run resumes from them.")


def atomic_write(path: Path, writer: Callable[[Path], None], needed: int | None = None, what: str | None = None) -> None:
    """Call `writer(tmp_path)` then rename tmp onto `path` (same folder, so the rename is atomic).
    `needed`: the bytes the file will take, when known, and `what`: what the file is (default: a
    stage's file), for the disk-full message."""
    path = Path(path)
    tmp: Path | None = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.close(fd)
        tmp = Path(name)
        writer(tmp)
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600; give the file the usual permissions
        os.replace(tmp, path)
    except BaseException as err:
        full = not isinstance(err, QvalError) and _disk_full(err, path.parent if path.parent.is_dir() else Path("/"))
        written = tmp.stat().st_size if full and tmp is not None and tmp.is_file() else 0
        if tmp is not None:
            tmp.unlink(missing_ok=True)
        if full:
            raise StorageError(disk_full_message(path, written, needed, what)) from None
        raise


def atomic_write_text(path: Path, text: str, what: str | None = None) -> None:
    blob = text.encode("utf-8")
    atomic_write(path, lambda p: p.write_bytes(blob), needed=len(blob), what=what)


def read_text_utf8(path: Path, error: type[QvalError] = QvalError) -> str:
    """A text file that must be UTF-8; a byte that is not names the file, the offset and the line."""
    data = Path(path).read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise error(f"{path}: byte 0x{data[err.start]:02x} at offset {err.start} (line {line}) is not UTF-8 ({err.reason}); "
                    f"save the file as UTF-8 (for example `iconv -f latin1 -t utf-8 {Path(path).name}`).") from None


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


def atomic_write_json(path: Path, obj: Any, what: str | None = None) -> None:
    atomic_write_text(path, json.dumps(to_jsonable(obj), indent=2, ensure_ascii=False) + "\n", what)


def read_json(path: Path) -> Any:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def hash_json(obj: Any) -> str:
    """A stable sha256 of a JSON-able object (sorted keys)."""
    blob = json.dumps(to_jsonable(obj), sort_keys=True, ensure_ascii=False).encode()
    return hashlib.sha256(blob).hexdigest()


def sha256_file(path: Path) -> str:
    """The sha256 of a file's whole content (a stage's outputs are verified with it on reuse)."""
    h = hashlib.sha256()
    with Path(path).open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


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


def tree_fingerprint(folder: Path, patterns: tuple[str, ...] = ("*",), exclude: tuple[Path, ...] = ()) -> str:
    """Fingerprint of every file in `folder` (recursive) matching `patterns`, names included; files in `exclude`
    (a marker written beside the files after their fingerprint) are left out."""
    folder = Path(folder)
    h = hashlib.sha256()
    skip = {Path(p) for p in exclude}
    files = sorted({p for pat in patterns for p in folder.rglob(pat) if p.is_file() and p not in skip})
    for p in files:
        h.update(str(p.relative_to(folder)).encode())
        h.update(file_fingerprint(p).encode())
    return h.hexdigest()
