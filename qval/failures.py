"""What the CLI does with an exception that is not a `QvalError`: a full, read-only or forbidden
disk gets a one-line message; anything else is a bug in qval, reported as "internal error, please
report" with its traceback saved to a file (never printed on the console).
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from .stages import last_run_folder

#: OSErrors that are the machine's state, not a bug: a full, read-only or forbidden disk
_STORAGE_ERRNOS = {errno.ENOSPC: "no space left on the device", errno.EDQUOT: "disk quota exceeded",
                   errno.EROFS: "the file system is read-only", errno.EACCES: "permission denied"}


def storage_message(err: OSError) -> str | None:
    """A one-line message for an OSError a user fixes by freeing or choosing a disk, else None."""
    why = _STORAGE_ERRNOS.get(err.errno or 0)
    if why is None:
        return None
    where = err.filename or "a file"
    return (f"{where}: {why}. Free some space or fix the permissions, or point --out (or report.dir) at another "
            f"disk; finished stages are kept and the next run resumes from them.")


def crash_report(err: BaseException, command: str, params: dict[str, object]) -> str:
    """Save an unexpected exception's traceback in the run folder (a temp file when there is none);
    the console gets one line and the file's name."""
    import importlib.metadata as md
    import platform
    import tempfile
    import time
    import traceback

    try:
        version = md.version("qval")
    except md.PackageNotFoundError:
        version = "unknown"
    args = " ".join(f"--{k.replace('_', '-')}={v}" for k, v in params.items())
    text = (f"command: qval {command} {args}\nqval {version}, Python {platform.python_version()}\n\n"
            + "".join(traceback.format_exception(type(err), err, err.__traceback__)))
    name = f"crash-{time.strftime('%Y%m%d-%H%M%S')}.txt"
    folder = last_run_folder()
    try:
        if folder is None:
            raise OSError("no run folder")
        path = folder / name
        path.write_text(text, encoding="utf-8")
    except OSError:
        fd, tmp = tempfile.mkstemp(prefix="qval-crash-", suffix=".txt")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        path = Path(tmp)
    return str(path)
