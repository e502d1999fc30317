"""CLI failures that used to escape as tracebacks: `build --dtype fp8` (a pydantic error),
`diagnose` on a checkpoint candidate (a TypeError), and any unexpected exception, which is now
exit 2 "internal error, please report" with its traceback saved to a file, not printed."""

from __future__ import annotations

import json
import re
from pathlib import Path

from qval import cli as qcli
from qval import pipeline
from tests.conftest import small_config, write_config

from .helpers import clean_error


def test_build_with_an_unknown_dtype(tmp_path):
    cfg = write_config(tmp_path, small_config("b"))
    out = clean_error("build", "--config", cfg, "--out", tmp_path / "r", "--dtype", "fp8", "-q")
    assert "--dtype 'fp8'" in out and "use one of auto, float16, bfloat16, float32" in out
    assert "ValidationError" not in out and "pydantic" not in out


def test_diagnose_on_a_checkpoint_candidate(tmp_path):
    folder = tmp_path / "cand"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}), encoding="utf-8")
    cfg = write_config(tmp_path, small_config("ck", engine={"backend": "checkpoint", "path": str(folder)}))
    out = clean_error("diagnose", "--config", cfg, "--out", tmp_path / "r", "-q")
    assert "engine backend 'checkpoint'" in out and "no quantizer scales to diagnose" in out and "fakequant" in out


def _crash_file(out: str) -> Path:
    found = re.search(r"The traceback is saved in (\S+); attach it", out)
    assert found, out
    return Path(found.group(1))


def test_unexpected_exception_without_a_run_folder(tmp_path, monkeypatch):
    def boom(config):
        raise RuntimeError("boom before any run folder")

    monkeypatch.setattr(qcli, "_load", boom)
    out = clean_error("validate", "--config", tmp_path / "any.yaml")
    assert "internal error, please report it: RuntimeError: boom before any run folder" in out
    crash = _crash_file(out)
    try:
        text = crash.read_text(encoding="utf-8")
        assert crash.name.startswith("qval-crash-") and "Traceback" in text and "boom before any run folder" in text
    finally:
        crash.unlink()


def test_unexpected_exception_saves_its_traceback_in_the_run_folder(tmp_path, monkeypatch):
    def broken_calibrate(s, alpha=None):
        return 1 / 0

    monkeypatch.setattr(pipeline, "calibrate", broken_calibrate)
    cfg = write_config(tmp_path, small_config("cand"))
    out = clean_error("calibrate", "--config", cfg, "--out", tmp_path / "r", "-q")
    assert "internal error, please report it: ZeroDivisionError: division by zero" in out
    crash = _crash_file(out)
    assert crash.parent == tmp_path / "r" / "cand" and crash.name.startswith("crash-")
    text = crash.read_text(encoding="utf-8")
    assert "Traceback" in text and "broken_calibrate" in text and text.startswith(f"command: qval calibrate --config={cfg}")


def test_user_errors_still_exit_2_without_a_crash_file(tmp_path):
    out = clean_error("validate", "--config", tmp_path / "missing.yaml")
    assert "no such config file" in out and "internal error" not in out


def test_an_escaping_disk_error_is_a_storage_message_not_a_crash(tmp_path, monkeypatch):
    import errno

    def full(s, alpha=None):
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "r" / "cand" / "export" / "model.safetensors"))

    monkeypatch.setattr(pipeline, "calibrate", full)
    out = clean_error("calibrate", "--config", write_config(tmp_path, small_config("cand")), "--out", tmp_path / "r", "-q")
    assert f"{tmp_path / 'r' / 'cand' / 'export' / 'model.safetensors'}: no space left on the device" in out
    assert "internal error" not in out and not list((tmp_path / "r" / "cand").glob("crash-*"))
