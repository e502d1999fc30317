"""The CLI's diagnostics options reject bad input with exit code 2 and a message, before any model loads."""

from __future__ import annotations

from typer.testing import CliRunner

from qval.cli import app

from ..conftest import small_config, write_config

runner = CliRunner()


def run(tmp_path, data, *args):
    path = write_config(tmp_path, data)
    result = runner.invoke(app, [*args[:1], "--config", str(path), "--out", str(tmp_path / "out"), "-q", *args[1:]])
    return result.exit_code, result.output + (result.stderr or "")


def test_bad_fallback_mode_is_a_user_error(tmp_path):
    code, out = run(tmp_path, small_config("c"), "gate", "--fallback", "maybe")
    assert code == 2 and "--fallback auto or --fallback off" in out and "Traceback" not in out


def test_bad_budgets_are_user_errors(tmp_path):
    code, out = run(tmp_path, small_config("c"), "gate", "--fallback", "auto", "--max-excluded", "0")
    assert code == 2 and "--max-excluded 0: give at least 1 part" in out
    code, out = run(tmp_path, small_config("c"), "gate", "--fallback", "auto", "--max-bits", "-1")
    assert code == 2 and "--max-bits -1.0" in out


def test_config_sections_are_strict(tmp_path):
    code, out = run(tmp_path, small_config("c", fallback={"mode": "auto", "max_layers": 3}), "gate")
    assert code == 2 and "unknown key 'fallback.max_layers'" in out and "max_excluded" in out
    code, out = run(tmp_path, small_config("c", diagnostics={"sensitivity": "sometimes"}), "gate")
    assert code == 2 and "diagnostics.sensitivity" in out


def test_diagnose_refuses_an_unquantized_candidate(tmp_path):
    code, out = run(tmp_path, small_config("plain", fmt="none"), "diagnose")
    assert code == 2 and "no quantizers to diagnose" in out
    assert not (tmp_path / "out").exists()  # refused before any work
