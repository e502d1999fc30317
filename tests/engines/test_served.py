"""The served engine's plumbing and error paths, against a stand-in server (tests/engines/standin_server.py)
whose every answer is known. The main test — a real vLLM server — is tests/engines/test_served_vllm.py.

Covered here: the completions API's answers parsed into compact blocks and generations; the server's
lifecycle (started under its supervisor, stopped with every process of its group, also when qval is
killed with SIGKILL mid-gate); every failure is a QvalError (exit 2) that says what to do.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from qval.config import parse_config
from qval.engines.api import Client, ServerError
from qval.engines.base import BuildContext
from qval.backends import LaunchOptions
from qval.engines.served import ServedEngine
from qval.engines.served_setup import build_served, check_tokenizer, served_model
from qval.engines.server import LaunchedServer, free_port, vllm_command
from qval.errors import ConfigError, ModelError, QvalError
from qval.metrics.tokens import token_stats
from tests.conftest import ROOT, write_config

STANDIN = str(Path(__file__).with_name("standin_server.py"))
VOCAB = 49152
sys.path.insert(0, str(Path(__file__).parent))
import standin_server  # noqa: E402  (its `logprobs_after`: the stand-in model's rule)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_gone(pid: int, seconds: float = 40.0) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if not alive(pid):
            return True
        time.sleep(0.2)
    return False


@pytest.fixture(scope="module")
def folder(tmp_path_factory, default_tokenizer, default_model_config):
    """A "model folder" the stand-in serves: the reference's tokenizer and config (no weights)."""
    path = tmp_path_factory.mktemp("standin_model")
    default_tokenizer.save_pretrained(path)
    default_model_config.to_json_file(path / "config.json")
    return path


def standin(folder: Path, tmp: Path, mode: str = "", timeout: float = 120.0) -> tuple[LaunchedServer, Path]:
    port = free_port()
    pidfile = tmp / f"standin-{port}.pid"
    command = vllm_command(LaunchOptions(command=[sys.executable, STANDIN]), None, folder, "cand", port, 8)
    env = {**os.environ, "STANDIN_MODE": mode, "STANDIN_PIDFILE": str(pidfile)}
    return LaunchedServer(command, env, port, tmp / f"server-{port}.log", timeout), pidfile


@pytest.fixture
def engine(folder, tmp_path):
    server, pidfile = standin(folder, tmp_path)
    server.start(log=lambda m: None)
    eng = ServedEngine(Client(server.url, timeout_s=60, retries=0, diagnose=server.diagnose), "cand", VOCAB, 8, 2, [2],
                       {}, server=server)
    yield eng
    eng.close()
    assert wait_gone(int(pidfile.read_text()), 30), "the stand-in outlived close()"


def test_scoring_parses_the_top_k_and_the_actual_token(engine):
    g = torch.Generator().manual_seed(0)
    x = torch.randint(3, VOCAB, (2, 24), generator=g)
    block = engine.logits(x)
    assert tuple(block.shape) == (2, 24, VOCAB) and block.k == 8
    for r in range(2):
        for t in range(24):
            lp = standin_server.logprobs_after(int(x[r, t]))
            top = np.argsort(-lp, kind="stable")[:8]
            assert block.top_idx[r, t].tolist() == top.tolist()
            assert block.best[r, t].item() == int(top[0])
            if t < 23:
                assert block.next_token[r, t].item() == int(x[r, t + 1])
                assert block.next_logp[r, t].item() == pytest.approx(float(lp[x[r, t + 1]]), abs=1e-6)
            else:
                assert block.next_token[r, t].item() == -1  # the last position: what would follow, from one generated token
    # against the stand-in's own full distributions: exact agreement, KLD ~ 0 (float32 rounding)
    ref = torch.stack([torch.from_numpy(standin_server.logprobs_after(int(i))) for i in x[0, :-1]])
    s = token_stats(ref, block[0, :-1], x[0, 1:])
    assert s["top1"].all() and s["kld"].abs().max() < 1e-5 and s["kld_lower"].abs().max() < 1e-5
    pieces = list(engine.logits_pieces(x[:1], 10))
    assert [p.shape[1] for p in pieces] == [10, 10, 4] and torch.equal(pieces[1].best, block.best[:1, 10:20])


def test_generation_is_greedy_and_eos_is_a_stop_or_suppressed(engine):
    prompt = [5, 6, 7]
    want, last = [], 7
    for _ in range(6):
        last = int(np.argmax(standin_server.logprobs_after(last)))
        want.append(last)
    gen = engine.generate([prompt, prompt], 6, suppress_eos=False, batch_size=2)
    assert gen.tokens == [want, want] and gen.first_nonfinite_step == [None, None] and gen.eos_step == [None, None]
    engine.eos = [want[2]]  # the third token is an EOS: a stop, kept, and suppressed when asked
    gen = engine.generate([prompt], 6, suppress_eos=False, batch_size=1)
    assert gen.tokens == [want[:3]] and gen.eos_step == [2]
    gen = engine.generate([prompt], 6, suppress_eos=True, batch_size=1)
    assert want[2] not in gen.tokens[0] and len(gen.tokens[0]) == 6 and gen.eos_step == [None]


def test_a_server_that_dies_mid_run_is_an_error_naming_it(folder, tmp_path):
    server, pidfile = standin(folder, tmp_path, mode="die_after:1")
    server.start(log=lambda m: None)
    eng = ServedEngine(Client(server.url, timeout_s=30, retries=1, diagnose=server.diagnose), "cand", VOCAB, 8, 1, [2], {},
                       server=server)
    try:
        eng.logits(torch.tensor([[5, 6, 7]]))
        with pytest.raises(ServerError, match="no longer running"):
            eng.logits(torch.tensor([[5, 6, 7]]))
    finally:
        eng.close()


@pytest.mark.parametrize("mode,timeout,match", [("exit_at_start", 120.0, "(?s)exited during start-up.*refusing to start"),
                                                 ("slow_start:60", 3.0, "did not answer within 3 s")])
def test_a_server_that_does_not_start_is_an_error_and_is_stopped(folder, tmp_path, mode, timeout, match):
    server, pidfile = standin(folder, tmp_path, mode=mode, timeout=timeout)
    with pytest.raises(ServerError, match=match):
        server.start(log=lambda m: None)
    assert server.proc is None
    if pidfile.exists():
        assert wait_gone(int(pidfile.read_text()), 30)


def test_qval_server_pidfile_records_each_started_server_s_process_group(folder, tmp_path, monkeypatch):
    """$QVAL_SERVER_PIDFILE (what .ci/run kills on exit): the group of the supervisor and the server it runs,
    one line per server started; a file that cannot be written is an error, the server stopped."""
    record = tmp_path / "servers.pgid"
    monkeypatch.setenv("QVAL_SERVER_PIDFILE", str(record))
    groups = []
    for _ in range(2):
        server, pidfile = standin(folder, tmp_path)
        server.start(log=lambda m: None)
        try:
            groups.append(os.getpgid(int(pidfile.read_text())))  # the stand-in's own group
            assert groups[-1] == server.proc.pid != os.getpgrp()
        finally:
            server.stop()
    assert [int(x) for x in record.read_text().split()] == groups
    monkeypatch.setenv("QVAL_SERVER_PIDFILE", str(tmp_path / "no_such_folder" / "servers.pgid"))
    server, pidfile = standin(folder, tmp_path)
    with pytest.raises(ConfigError, match=r"\$QVAL_SERVER_PIDFILE=.*no_such_folder.*cannot record"):
        server.start(log=lambda m: None)
    assert server.proc is None and not server.alive()


def test_wrong_model_name_tokenizer_and_missing_prompt_logprobs(folder, tmp_path, default_tokenizer):
    server, _ = standin(folder, tmp_path)
    server.start(log=lambda m: None)
    try:
        client = Client(server.url, timeout_s=30, retries=0)
        with pytest.raises(ServerError, match="serves no model named 'other'.*it serves: cand"):
            served_model(client, "other")
        assert served_model(client, None)[0] == "cand"
        assert "checked" in check_tokenizer(client, "cand", default_tokenizer)
    finally:
        server.stop()
    for mode, error, match in (("bad_tokenizer", ModelError, "tokenizer differs from the reference's"),
                               ("no_prompt_logprobs", ServerError, "returned no prompt_logprobs")):
        server, _ = standin(folder, tmp_path, mode=mode)
        server.start(log=lambda m: None)
        try:
            client = Client(server.url, timeout_s=30, retries=0)
            with pytest.raises(error, match=match):
                check_tokenizer(client, "cand", default_tokenizer)
                ServedEngine(client, "cand", VOCAB, 8, 1, [2], {}).logits(torch.tensor([[5, 6, 7]]))
        finally:
            server.stop()


def _ctx(tmp_path: Path, default_model, options: dict) -> BuildContext:
    cfg = parse_config({"name": "s", "quant": {"format": "none"}, "engine": {"backend": "served", "options": options},
                        "gates": {"agreement": {"min_top1": 0.5}}})
    return BuildContext(config=cfg, reference=default_model, calib_state=None, run_dir=tmp_path / "run", log=lambda m: None)


def test_builder_errors_say_what_to_do(folder, tmp_path, default_model):
    # a port in use
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(ConfigError, match=f"port {port} is in use"):
            build_served(_ctx(tmp_path, default_model, {"launch": {"command": [sys.executable, STANDIN], "model": str(folder),
                                                                   "port": port}}))
    # nothing listens at the URL
    with pytest.raises(ServerError, match="failed listing its models"):
        build_served(_ctx(tmp_path, default_model, {"url": f"http://127.0.0.1:{free_port()}", "retries": 0}))
    # no Python for vLLM
    env = os.environ.pop("QVAL_VLLM_PYTHON", None)
    try:
        with pytest.raises(ConfigError, match="QVAL_VLLM_PYTHON"):
            build_served(_ctx(tmp_path, default_model, {"launch": {"model": str(folder)}}))
    finally:
        if env is not None:
            os.environ["QVAL_VLLM_PYTHON"] = env
    # not a model folder
    with pytest.raises(ModelError, match="not a model folder"):
        build_served(_ctx(tmp_path, default_model, {"launch": {"command": [sys.executable, STANDIN], "model": str(tmp_path)}}))


def test_options_are_validated_before_anything_runs():
    with pytest.raises(QvalError, match="exactly one of them"):
        parse_config({"name": "s", "quant": {"format": "none"}, "engine": {"backend": "served", "options": {}},
                      "gates": {"agreement": {"min_top1": 0.5}}})
    with pytest.raises(QvalError, match="launch.python or launch.command, not both"):
        parse_config({"name": "s", "quant": {"format": "none"}, "engine": {"backend": "served", "options": {
            "launch": {"python": "p", "command": ["c"]}}}, "gates": {"agreement": {"min_top1": 0.5}}})


def standin_launch(folder: Path, tmp: Path, who: str, mode: str = "") -> dict:
    """A config's `launch` section that starts the stand-in (`STANDIN_MODE` `mode`), its pid in `tmp/<who>.pid`."""
    return {"command": [sys.executable, STANDIN], "model": str(folder), "startup_timeout_s": 120,
            "env": {"STANDIN_MODE": mode, "STANDIN_PIDFILE": str(tmp / f"{who}.pid")}}


def _served_config(tmp_path: Path, folder: Path, mode: str) -> Path:
    """Gate 1 of a stand-in candidate (`STANDIN_MODE` `mode`) against a stand-in reference, both started by qval,
    their pids in `cand.pid` and `ref.pid`: no model is loaded, so the run reaches its gate in seconds."""
    return write_config(tmp_path, {
        "name": "served_standin", "quant": {"format": "none"},
        "model": {"source": "served", "served": {"top_k": 8, "retries": 0,
                                                 "launch": standin_launch(folder, tmp_path, "ref")}},
        "engine": {"backend": "served", "options": {"top_k": 8, "retries": 0,
                                                    "launch": standin_launch(folder, tmp_path, "cand", mode)}},
        "gates": {"agreement": {"dataset": str(ROOT / "calib_data/heldout_eval.jsonl"), "tokens": 2048, "ctx": 512,
                                "batch_size": 1, "min_top1": 0.0, "max_mean_kld": 100.0}},
        "report": {"dir": str(tmp_path / "runs")}})


def test_qval_killed_mid_gate_leaves_no_server(folder, tmp_path):
    config = _served_config(tmp_path, folder, "sleep:3")
    proc = subprocess.Popen([sys.executable, "-m", "qval.cli", "gate", "--config", str(config)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    log = tmp_path / "runs" / "served_standin" / "served" / "server.log"
    end = time.monotonic() + 300
    while time.monotonic() < end and not (log.is_file() and "serving" in log.read_text()):
        assert proc.poll() is None, proc.stdout.read()
        time.sleep(0.5)
    time.sleep(6)  # mid-gate: the first scoring requests are in flight
    servers = {who: int((tmp_path / f"{who}.pid").read_text()) for who in ("cand", "ref")}
    assert all(alive(pid) for pid in servers.values()), servers
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    for who, pid in servers.items():
        assert wait_gone(pid, 40), f"the {who} server outlived a qval killed with SIGKILL"


def test_a_server_dying_mid_gate_is_exit_2_with_its_log(folder, tmp_path):
    config = _served_config(tmp_path, folder, "die_after:2")
    out = subprocess.run([sys.executable, "-m", "qval.cli", "gate", "--config", str(config)], capture_output=True,
                         text=True, timeout=900)
    text = out.stdout + out.stderr
    assert out.returncode == 2, text
    assert "no longer running" in text and "Traceback" not in text
    assert not alive(int((tmp_path / "cand.pid").read_text()))
    assert wait_gone(int((tmp_path / "ref.pid").read_text()), 40), "the reference's server outlived the failed run"
