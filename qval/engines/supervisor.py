"""The keeper of a server qval started: `python -m qval.engines.supervisor LOG -- COMMAND...`.

qval starts this process in a new session, with a pipe on its standard input whose other end only
qval holds. It starts COMMAND (the server) in the same session, its output to LOG, and waits. When
the pipe reaches end of file — qval closed it to stop the server, or qval is gone however it ended
(Ctrl-C, a crash, `kill -9`: the kernel closes a dead process's files) — it stops the whole session's
process group: SIGTERM, a grace period, then SIGKILL. A server that spawns workers (vLLM's engine
core) loses them too, since they share the group. When the server exits by itself, the supervisor
ends with its exit code after clearing whatever the server left in the group.

Standard library only, so it starts at once and never imports what it supervises.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time

GRACE_S = 20.0  # from SIGTERM to SIGKILL


def _group() -> list[int]:
    """The other processes of this process group (Linux's /proc)."""
    me, pgid, out = os.getpid(), os.getpgrp(), []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != b"Z":  # after the name: state, ppid, pgrp; a zombie is gone
            out.append(int(entry))
    return out


def _signal(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def _stop_group(child: subprocess.Popen, grace: float = GRACE_S) -> None:
    """SIGTERM to every other process of this group (the server and its workers), SIGKILL to those
    still there once the grace is over."""
    _signal(_group(), signal.SIGTERM)
    end = time.monotonic() + grace
    while time.monotonic() < end and _group():
        if child.poll() is None:
            time.sleep(0.2)
        else:
            child.wait()
            time.sleep(0.2)
    _signal(_group(), signal.SIGKILL)
    if child.poll() is None:
        child.wait()


def main(argv: list[str]) -> int:
    if "--" not in argv or argv.index("--") != 1 or len(argv) < 3:
        sys.stderr.write("usage: python -m qval.engines.supervisor LOG -- COMMAND...\n")
        return 2
    log, command = argv[0], argv[2:]
    with open(log, "ab", buffering=0) as out:
        child = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
    while True:
        ready, _, _ = select.select([sys.stdin], [], [], 0.5)
        if ready and not os.read(sys.stdin.fileno(), 4096):  # end of file: qval asks us to stop, or is gone
            _stop_group(child)
            return 0
        if (code := child.poll()) is not None:
            _stop_group(child, grace=2.0)
            return code


if __name__ == "__main__":  # pragma: no cover - run as a process
    sys.exit(main(sys.argv[1:]))
