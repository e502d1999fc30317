"""A qval call leaves the process as it found it: no warning filter, logger level, environment
variable, progress-bar switch or umask changed behind the caller's back (issue 13, part 5)."""

from __future__ import annotations

import logging
import os
import warnings

import torch  # noqa: F401 - imported first: its own import-time warning filters are not qval's
from typer.testing import CliRunner

from qval.cli import app, quiet_libraries

from .conftest import ROOT

NAMES = ("TRANSFORMERS_VERBOSITY", "HF_HUB_DISABLE_PROGRESS_BARS", "TQDM_DISABLE", "DS_ACCELERATOR")
LOGGERS = ("transformers", "modelopt", "accelerate", "DeepSpeed", "torch.distributed", "")


def _state():
    return (list(warnings.filters), {n: logging.getLogger(n).level for n in LOGGERS}, {n: os.environ.get(n) for n in NAMES})


def test_quieting_is_scoped_to_the_command(monkeypatch):
    for n in NAMES:
        monkeypatch.delenv(n, raising=False)
    monkeypatch.setenv("TQDM_DISABLE", "0")  # the user's own setting is neither overridden nor removed
    logging.getLogger("transformers").setLevel(logging.INFO)
    before = _state()
    with quiet_libraries():
        assert logging.getLogger("transformers").level == logging.ERROR and logging.getLogger().level == logging.ERROR
        assert os.environ["TRANSFORMERS_VERBOSITY"] == "error" and os.environ["TQDM_DISABLE"] == "0"
        assert any(f[0] == "ignore" and f[3] is not None and "modelopt" in f[3].pattern for f in warnings.filters)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            warnings.warn("still shown: only the libraries' module patterns are silenced")
        assert len(seen) == 1
    assert _state() == before
    logging.getLogger("transformers").setLevel(logging.NOTSET)


def test_a_command_run_in_process_restores_everything_even_when_it_fails(monkeypatch):
    for n in NAMES:
        monkeypatch.delenv(n, raising=False)
    before = _state()
    ok = CliRunner().invoke(app, ["validate", "--config", str(ROOT / "checks/fp8_kvfp16.yaml")])
    assert ok.exit_code == 0, ok.output
    assert _state() == before
    bad = CliRunner().invoke(app, ["validate", "--config", str(ROOT / "checks/no_such_check.yaml")])
    assert bad.exit_code == 2, bad.output
    assert _state() == before


def test_loading_a_model_leaves_transformers_progress_bars_as_they_were(recwarn):
    from transformers.utils import logging as hf_logging  # (huggingface_hub warns when its env switch wins: recorded)

    from qval.models import _no_progress_bar

    hf_logging.enable_progress_bar()
    with _no_progress_bar():
        assert not hf_logging.is_progress_bar_enabled()
    assert hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    with _no_progress_bar():
        pass
    assert not hf_logging.is_progress_bar_enabled()  # off stays off
    hf_logging.enable_progress_bar()


def test_the_umask_is_read_without_being_changed():
    from qval.io import _current_umask

    old = os.umask(0o027)
    try:
        assert _current_umask() == 0o027
        assert os.umask(0o027) == 0o027  # still what the caller set
    finally:
        os.umask(old)


def test_progress_bars_are_off_inside_a_command_started_in_a_fresh_process():
    """TQDM_DISABLE is read once, when tqdm is imported (torch imports it): it must be set before."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("TQDM_")}
    code = ("from qval.cli import quiet_libraries\n"
            "with quiet_libraries():\n"
            "    import tqdm\n"
            "    print(tqdm.tqdm(range(1)).disable)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "True", (out.stdout, out.stderr[-500:])
