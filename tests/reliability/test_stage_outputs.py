"""Stored stage outputs are verified, not trusted: done.json records the sha256 of every file the
stage wrote, and a reused stage whose files were edited, truncated or removed is recomputed with a
note. Checked on a bare Stage, on the gate loop (result.json, positions.npz) and on `qval calibrate`."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from qval import pipeline
from qval.config import parse_config
from qval.registry import Registry
from qval.stages import RunDir
from qval.verdict import GateResult
from tests.conftest import small_config, write_config

from .helpers import cli, tiny_calibration, toy_reference


def _finished(tmp_path):
    run = RunDir(tmp_path, "cand")
    stage = run.stage("gate_x", {"a": 1})
    started = stage.begin()
    (stage.path / "result.json").write_text('{"value": 1}\n', encoding="utf-8")
    (stage.path / "sub").mkdir()
    np.savez(stage.path / "sub" / "positions.npz", kld=np.arange(10.0))
    stage.finish(started)
    return run, stage


def test_done_json_records_the_sha256_of_every_file(tmp_path):
    _, stage = _finished(tmp_path)
    files = json.loads(stage.done_file.read_text(encoding="utf-8"))["files"]
    assert files == {name: hashlib.sha256((stage.path / name).read_bytes()).hexdigest()
                     for name in ("result.json", "sub/positions.npz")}
    assert RunDir(tmp_path, "cand").stage("gate_x", {"a": 1}).is_done()


@pytest.mark.parametrize(("damage", "says"), [
    (lambda p: p.write_text('{"value": 2}\n', encoding="utf-8"), "result.json does not match"),  # same size, edited
    (lambda p: p.write_bytes(p.read_bytes()[:-3]), "result.json does not match"),  # truncated
    (lambda p: p.unlink(), "result.json is missing"),
])
def test_a_damaged_file_means_recompute_with_a_note(tmp_path, capsys, damage, says):
    _, stage = _finished(tmp_path)
    damage(stage.path / "result.json")
    again = RunDir(tmp_path, "cand").stage("gate_x", {"a": 1})
    assert not again.is_done()
    assert says in again.note and "recomputing it" in again.note
    assert f"qval: note: {stage.path}: stage gate_x: {says}" in capsys.readouterr().err


def test_done_json_without_file_hashes_is_not_trusted(tmp_path):
    _, stage = _finished(tmp_path)
    done = json.loads(stage.done_file.read_text(encoding="utf-8"))
    del done["files"]
    stage.done_file.write_text(json.dumps(done), encoding="utf-8")
    again = RunDir(tmp_path, "cand").stage("gate_x", {"a": 1})
    assert not again.is_done() and "records no file hashes" in again.note


def _fake_gates(calls: list[int]) -> Registry:
    """One gate that writes what gate 1 writes (result.json by the loop, positions.npz by itself)."""
    from qval.gates.base import GateSpec

    def run(ctx):
        calls.append(1)
        np.savez(ctx.folder / "positions.npz", kld=np.linspace(0, 1, 100))
        return GateResult("fake", "ok")

    gates: Registry = Registry("gate")
    gates.register("fake")(GateSpec(name="fake", run=run, thresholds=lambda cfg, r: [], inputs=lambda cfg: {"n": 1},
                                    enabled=lambda cfg: True))
    return gates


@pytest.mark.parametrize(("name", "damage"), [
    ("positions.npz", lambda p: p.write_bytes(p.read_bytes()[:100])),
    ("result.json", lambda p: p.write_bytes(p.read_bytes()[:10])),
    ("positions.npz", lambda p: p.unlink()),
])
def test_gate_loop_recomputes_a_truncated_or_missing_output(tmp_path, monkeypatch, capsys, name, damage):
    calls: list[int] = []
    monkeypatch.setattr(pipeline, "GATES", _fake_gates(calls))
    monkeypatch.setattr(pipeline, "build", lambda s, calib: object())
    cfg = parse_config(small_config("cand"))

    def session() -> pipeline.Session:
        return pipeline.Session.open(cfg, tmp_path, loaded=toy_reference())

    pipeline.run_gates(session(), None)
    s = session()
    pipeline.run_gates(s, None)
    assert len(calls) == 1 and s.run.log["gate_fake"]["cached"]
    damage(tmp_path / "cand" / "gate_fake" / name)
    s = session()
    results = pipeline.run_gates(s, None)
    assert len(calls) == 2 and not s.run.log["gate_fake"]["cached"] and results["fake"].status == "ok"
    assert name in s.run.log["gate_fake"]["note"]
    assert f"stage gate_fake: {name}" in capsys.readouterr().err
    with np.load(tmp_path / "cand" / "gate_fake" / "positions.npz") as z:
        assert z["kld"].shape == (100,)


def test_calibrate_after_quant_state_was_removed_recalibrates(tmp_path, monkeypatch):
    monkeypatch.setattr("qval.run_reference.load_model", lambda cfg: toy_reference())
    cfg = write_config(tmp_path, small_config("toy", calibration=tiny_calibration(tmp_path)))
    args = ("calibrate", "--config", cfg, "--out", tmp_path / "r", "-q")
    code, out = cli(*args)
    assert code == 0 and "toy: calibration done" in out, out
    code, out = cli(*args)
    assert code == 0 and "toy: calibration reused" in out, out
    (tmp_path / "r" / "toy" / "calibrate" / "quant_state.pt").unlink()
    code, out = cli(*args)
    assert code == 0 and "toy: calibration done" in out, out
    assert "stage calibrate: quant_state.pt is missing; recomputing it" in out
    assert (tmp_path / "r" / "toy" / "calibrate" / "quant_state.pt").is_file()
