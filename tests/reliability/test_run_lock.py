"""One run folder, one writer: a second run into a folder another process holds fails at once
(exit 2, naming the holder's pid); a killed holder leaves nothing that blocks the next run."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from qval.stages import LOCK_FILE, RunDir
from tests.conftest import ROOT, small_config, write_config

from .helpers import cli, clean_error

HOLD = "import sys, time; from qval.stages import RunDir; r = RunDir(sys.argv[1], 'cand'); print('ready', flush=True); time.sleep(120)"


def _holder(root) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(root)], stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def test_second_run_fails_at_once_naming_the_holder_then_runs_once_it_died(tmp_path):
    cfg = write_config(tmp_path, small_config("cand", fmt="none"))
    args = ("calibrate", "--config", cfg, "--out", tmp_path / "r", "-q")
    holder = _holder(tmp_path / "r")
    try:
        t0 = time.perf_counter()
        out = clean_error(*args)
        assert time.perf_counter() - t0 < 60  # at once: no waiting for the holder
        assert f"{tmp_path / 'r' / 'cand'} is in use by another qval run (pid {holder.pid})" in out
        assert "another --out folder" in out
    finally:
        holder.kill()  # as a crash would: no clean-up runs, the kernel drops the flock
        holder.wait()
    assert (tmp_path / "r" / "cand" / LOCK_FILE).read_text().strip() == str(holder.pid)  # the stale lock file is still there
    code, out = cli(*args)
    assert code == 0, out
    assert (tmp_path / "r" / "cand" / LOCK_FILE).read_text().strip() == str(os.getpid())


def test_a_lock_file_left_by_a_dead_process_does_not_block(tmp_path):
    (tmp_path / "cand").mkdir()
    (tmp_path / "cand" / LOCK_FILE).write_text("999999\n")
    run = RunDir(tmp_path, "cand")
    assert (run.path / LOCK_FILE).read_text() == f"{os.getpid()}\n"


def test_one_process_may_open_its_own_run_folder_twice_and_releases_it(tmp_path):
    first = RunDir(tmp_path, "cand")
    second = RunDir(tmp_path, "cand")  # the fallback search and a sweep do this within one run
    assert first._lock is second._lock
    del first, second
    probe = subprocess.run([sys.executable, "-c", HOLD.replace("time.sleep(120)", "pass"), str(tmp_path)],
                           capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT)
    assert probe.returncode == 0 and probe.stdout.strip() == "ready", probe.stderr
