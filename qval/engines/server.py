"""A vLLM server that qval starts, owns and always stops.

The server runs under `qval.engines.supervisor` in a process session of its own; qval holds the only
write end of the supervisor's standard input. `stop()` closes it; so does the kernel when qval dies
in any way (Ctrl-C, an exception, SIGTERM, `kill -9`), and the supervisor then stops the server's
whole process group. The log goes to the run folder. Start-up waits for the API to answer, with a
timeout; a server that exits or never answers is a `ServerError` (exit 2) with its last log lines.
With `$QVAL_SERVER_PIDFILE` set, each server's process group is appended to that file, one a line
(`record_group`): a script can then stop exactly the servers its runs started, should the supervisor die too.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

from ..errors import ConfigError
from .api import Client, ServerError
from ..backends import LaunchOptions

PIDFILE_ENV = "QVAL_SERVER_PIDFILE"  # where each started server's process group is recorded, if set
VLLM_MODULE = "vllm.entrypoints.openai.api_server"  # `vllm serve` of some CPU builds cannot find its own version
#: `vllm serve` as a module: what runs several API front ends (`launch.api_servers`; the module above runs one)
VLLM_SERVE = ("vllm.entrypoints.cli.main", "serve")
LOG_LINES = 25  # lines of the server's log an error message carries


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_in_use(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def vllm_command(launch: LaunchOptions, python: str | None, model_dir: Path, name: str, port: int, top_k: int) -> list[str]:
    """The server's command line: `python -m vllm.entrypoints.openai.api_server` (or `launch.command`; with
    `launch.api_servers` > 1, `python -m vllm.entrypoints.cli.main serve … --api-server-count N`) with the model,
    its name in the API, the address, and the settings the config gives."""
    if launch.command:
        head = list(launch.command)
    elif launch.api_servers > 1:
        head = [str(python), "-m", *VLLM_SERVE]
    else:
        head = [str(python), "-m", VLLM_MODULE]
    args = ["--model", str(model_dir), "--served-model-name", name, "--host", "127.0.0.1", "--port", str(port),
            "--max-logprobs", str(top_k), "--dtype", launch.dtype, "--kv-cache-dtype", launch.kv_cache_dtype,
            "--tensor-parallel-size", str(launch.tensor_parallel_size)]
    if launch.api_servers > 1:
        args += ["--api-server-count", str(launch.api_servers)]
    if launch.quantization:
        args += ["--quantization", launch.quantization]
    if launch.max_model_len:
        args += ["--max-model-len", str(launch.max_model_len)]
    return head + args + list(launch.args)


def python_of(launch: LaunchOptions, resolve: Callable[[str], Path], where: str = "engine.options.launch") -> str | None:
    """The interpreter of the server's environment (None when `launch.command` is given instead); `where`:
    the launch section's place in the config, for messages."""
    if launch.command:
        return None
    given = launch.python or os.environ.get("QVAL_VLLM_PYTHON")
    if not given:
        raise ConfigError(f"{where}.python is not set and neither is $QVAL_VLLM_PYTHON: give the Python "
                          "of vLLM's environment (for example /opt/vllm-venv/bin/python), or launch.command.")
    path = Path(given).expanduser()
    if os.sep in given or path.exists():
        path = resolve(given) if not path.is_absolute() else path
        if not path.is_file():
            raise ConfigError(f"{where}.python: {given} is not a file; give the Python of vLLM's "
                              "environment (for example /opt/vllm-venv/bin/python).")
        return str(path.absolute())  # not resolved: a venv's python is a link whose own folder makes it that venv
    return given  # a command name, looked up on PATH when it starts


def record_group(group: int) -> None:
    """Append a started server's process group (its supervisor's pid: a session of its own) to
    `$QVAL_SERVER_PIDFILE`, when set: what a CI script kills on exit, and nothing else."""
    path = os.environ.get(PIDFILE_ENV)
    if path:
        try:
            with open(path, "a", encoding="utf-8") as f:
                f.write(f"{group}\n")
        except OSError as err:
            raise ConfigError(f"${PIDFILE_ENV}={path}: cannot record the server's process group there ({err}); "
                              "point it at a writable file, or unset it") from None


class LaunchedServer:
    """One server process (under its supervisor), its log, and the client that reaches it."""

    def __init__(self, command: list[str], env: dict[str, str], port: int, log: Path, startup_timeout_s: float) -> None:
        self.command = command
        self.env = env
        self.port = port
        self.log = log
        self.startup_timeout_s = startup_timeout_s
        self.url = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen | None = None
        self.startup_seconds: float | None = None

    def log_tail(self, lines: int = LOG_LINES) -> str:
        try:
            text = self.log.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(text[-lines:])

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def diagnose(self) -> str:
        """What an error message adds: whether the server still runs, and its last log lines."""
        if self.proc is not None:  # a server that just died: its supervisor notices within half a second
            try:
                self.proc.wait(timeout=3.0)
            except subprocess.TimeoutExpired:
                pass
        state = "it is still running" if self.alive() else "it is no longer running"
        return f" The server qval started ({state}; log {self.log}) last wrote:\n{self.log_tail()}"

    def start(self, log: Callable[[str], Any] = print) -> None:
        """Start it and wait until its API answers; a ServerError (it is stopped) otherwise."""
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as f:
            f.write(("$ " + " ".join(self.command) + "\n").encode("utf-8"))
        t0 = time.perf_counter()
        try:
            self.proc = subprocess.Popen([sys.executable, "-m", "qval.engines.supervisor", str(self.log), "--", *self.command],
                                         stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                         env=self.env, start_new_session=True)
        except OSError as err:
            raise ServerError(f"could not start the server's supervisor: {err}") from None
        log(f"served engine: starting the server on port {self.port} (log {self.log}) …")
        probe = Client(self.url, timeout_s=5, retries=0)
        try:
            record_group(self.proc.pid)
            while True:
                if not self.alive():
                    code = self.proc.returncode
                    raise ServerError(f"the server exited during start-up (exit code {code}); its log {self.log} ends:\n"
                                      f"{self.log_tail()}\nFix what it says (the command is the log's first line).")
                if probe.ready("/v1/models"):
                    break
                if time.perf_counter() - t0 > self.startup_timeout_s:
                    raise ServerError(f"the server did not answer within {self.startup_timeout_s:g} s "
                                      f"(launch.startup_timeout_s); its log {self.log} ends:\n{self.log_tail()}")
                time.sleep(1.0)
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.perf_counter() - t0
        log(f"served engine: server ready after {self.startup_seconds:.0f} s")

    def stop(self, timeout_s: float = 60.0) -> None:
        """Stop the server and everything it started (its supervisor does); idempotent."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        try:
            if proc.stdin is not None:
                proc.stdin.close()
        except OSError:
            pass
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:  # the supervisor itself is stuck: end its whole session
            try:
                os.killpg(proc.pid, 9)
            except ProcessLookupError:
                pass
            proc.wait()

    def __del__(self) -> None:  # a server never outlives the object that owns it
        try:
            self.stop(timeout_s=30.0)
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass
